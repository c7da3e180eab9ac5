"""Pytrees: nested lists, tuples, namedtuples and dicts, taken apart into their leaves and a hashable structure.

Modelled on JAX's `tree_flatten`/`tree_unflatten`. @jitop.kernel uses it for arguments: a container that holds
arrays is flattened, its leaves become the kernel's parameters, and its structure is part of the cache key.

A structure (`TreeDef`) is plain hashable data: `None` for a leaf, `(list | tuple | a namedtuple class,
children)` for a sequence, `(dict | OrderedDict, keys, children)` for a dict (keys in insertion order). Only
exact list, tuple, dict and OrderedDict (and namedtuples) are containers; anything else, other subclasses of
list and dict included, is a leaf.

>>> leaves, tree = flatten({"w": [1, 2], "b": (3, None)})
>>> leaves
[1, 2, 3, None]
>>> unflatten(tree, ["a", "b", "c", "d"])
{'w': ['a', 'b'], 'b': ('c', 'd')}
>>> paths(tree, "params")
["params['w'][0]", "params['w'][1]", "params['b'][0]", "params['b'][1]"]
>>> flatten([(1, 2), 3], is_leaf=lambda t: type(t) is tuple)
([(1, 2), 3], (<class 'list'>, (None, None)))
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

__all__ = ["TreeDef", "is_node", "flatten", "unflatten", "num_leaves", "paths", "any_leaf"]

TreeDef = Any  # None | tuple[type, tuple[TreeDef, ...]] | tuple[type[dict], tuple[Any, ...], tuple[TreeDef, ...]]


def is_node(x: Any) -> bool:
    """Whether `x` is a container this module takes apart: an exact list, tuple, dict or OrderedDict, or a
    namedtuple.

    >>> is_node([1]), is_node({"a": 1}), is_node("ab"), is_node(None)
    (True, True, False, False)
    """
    t = type(x)
    return t is list or t is tuple or t is dict or t is OrderedDict or (isinstance(x, tuple) and hasattr(t, "_fields"))


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Any], TreeDef]:
    """(leaves in depth-first order, structure). `is_leaf(container)` True keeps that container whole, as one
    leaf (it is asked about containers only).

    >>> flatten([1, (2, 3)])
    ([1, 2, 3], (<class 'list'>, (None, (<class 'tuple'>, (None, None)))))
    """
    leaves: list[Any] = []

    def walk(x: Any) -> TreeDef:
        t = type(x)
        if t is dict or t is OrderedDict:
            if is_leaf is not None and is_leaf(x):
                leaves.append(x)
                return None
            return (t, tuple(x), tuple([walk(v) for v in x.values()]))
        if t is list or t is tuple or (isinstance(x, tuple) and hasattr(t, "_fields")):
            if is_leaf is not None and is_leaf(x):
                leaves.append(x)
                return None
            if not any(issubclass(c, _NODE_TYPES) for c in set(map(type, x))):
                leaves.extend(x)  # all leaves (a list of arrays, the common case): no call per leaf
                return (t, (None,) * len(x))
            return (t, tuple([walk(v) for v in x]))
        leaves.append(x)
        return None
    return leaves, walk(tree)


_NODE_TYPES = (list, tuple, dict)  # a subclass of list or dict is a leaf: too broad a test only skips the shortcut


def unflatten(tree: TreeDef, leaves: Sequence[Any]) -> Any:
    """The container `tree` describes, with `leaves` (depth-first order) in place of its leaves.

    >>> unflatten((tuple, (None, (dict, ("k",), (None,)))), [1, 2])
    (1, {'k': 2})
    """
    it = iter(leaves)
    out = _build(tree, it)
    if next(it, _END) is not _END:
        raise ValueError(f"unflatten: more leaves than the structure's {num_leaves(tree)}")
    return out


_END = object()


def _build(tree: TreeDef, it: Iterator[Any]) -> Any:
    if tree is None:
        x = next(it, _END)
        if x is _END:
            raise ValueError("unflatten: fewer leaves than the structure has")
        return x
    t = tree[0]
    if t is dict or t is OrderedDict:
        return t((k, _build(c, it)) for k, c in zip(tree[1], tree[2]))
    children = [_build(c, it) for c in tree[1]]
    if t is list:
        return children
    if t is tuple:
        return tuple(children)
    return t(*children)  # a namedtuple


def num_leaves(tree: TreeDef) -> int:
    """How many leaves a structure holds.

    >>> num_leaves(flatten([1, {"a": 2, "b": [3, 4]}])[1])
    4
    """
    if tree is None:
        return 1
    return sum(num_leaves(c) for c in tree[-1])


def paths(tree: TreeDef, root: str = "") -> list[str]:
    """Each leaf's place as Python source, `root` followed by indexing (`params[3]['w']`), in leaf order; for
    error messages."""
    if tree is None:
        return [root]
    if len(tree) == 3:  # a dict
        return [p for k, c in zip(tree[1], tree[2]) for p in paths(c, f"{root}[{k!r}]")]
    return [p for i, c in enumerate(tree[1]) for p in paths(c, f"{root}[{i}]")]


def any_leaf(tree: Any, pred: Callable[[Any], bool]) -> bool:
    """Whether some leaf of `tree` satisfies `pred` (stops at the first).

    >>> any_leaf([1, (2, "x")], lambda v: isinstance(v, str))
    True
    """
    t = type(tree)
    if t is dict or t is OrderedDict:
        return any(any_leaf(v, pred) for v in tree.values())
    if t is list or t is tuple or (isinstance(tree, tuple) and hasattr(t, "_fields")):
        return any(any_leaf(v, pred) for v in tree)
    return pred(tree)
