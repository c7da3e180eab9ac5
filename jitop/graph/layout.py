"""Layout: NCHW convolutions run channels-last, and the elementwise work between them follows.

An NCHW convolution writes its channel lanes to 16 different planes (a scatter per vector) and reads its
input through a transposing copy or im2col; channels-last, its output rows are contiguous vectors and a 1x1
convolution is a plain matmul over pixels. So, as TVM's ConvertLayout and onnxruntime's NCHWc transformer
do, each dense (and each depthwise) NCHW conv2d becomes an NHWC one between two transposes, and the
transposes are pushed through the elementwise operations after it (bias, activation, residual add) and
through a max pooling's padding and strided windows, until they meet the next convolution, where they
cancel, or a global pooling, which reduces channels-last. What is left are transposes at the edges (the
network input, a flatten), free index changes that fuse into their consumer. ResNet-50 ran 1.2x faster so,
MobileNet-V2 1.5x (2-core AVX-512, benchmarks/RESULTS.md). A convolution with no other one joined to it
stays NCHW: the two transposes would cost more than they save.

Values are tracked as (node, held): `held` is True when the node holds the logical NCHW value transposed to
NHWC. Only graph nodes are rebuilt: the result computes exactly what the traced graph computes.
"""
from __future__ import annotations

from jitop.graph import prims
from jitop.graph.ir import Node, node, toposort

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def channels_last(results: list[Node]) -> list[Node]:
    """`results` computed with the NCHW conv2d nodes that gain from it in NHWC (`_converts`, and joined to
    another such convolution); the nodes themselves when the graph has none."""
    order = toposort(results)
    convert = _chained(order)
    if not convert:
        return results
    held: dict[Node, tuple[Node, bool]] = {}
    for n in order:
        held[n] = _rewrite(n, held, convert)
    return [_logical(*held[r]) for r in results]


def _chained(order: list[Node]) -> set[Node]:
    """The convolutions to convert: those `_converts` accepts that are joined to another one through the
    operations the transposes pass (a lone NCHW convolution would pay a transpose on each side: a depthwise
    one ran 3x slower so)."""
    parent: dict[Node, Node] = {}

    def root(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n
    for n in order:
        if not (_converts(n) or _passes(n)):
            continue
        parent[n] = n
        for s in n.src:
            if s in parent:
                parent[root(s)] = root(n)
    convs = [n for n in parent if _converts(n)]
    per_region: dict[Node, int] = {}
    for n in convs:
        per_region[root(n)] = per_region.get(root(n), 0) + 1
    return {n for n in convs if per_region[root(n)] >= 2}


def _passes(n: Node) -> bool:
    """A 4-d operation a transpose is pushed through: per-element arithmetic (operands broadcast as numpy's),
    a max pooling's padding (concat) and its strided windows (an index keeping every axis)."""
    return n.ndim == 4 and (prims.get(n.prim).elementwise or n.prim == "concat" or n.prim == "index" and _keeps_axes(n))


def _channels_last_params(n: Node) -> dict:
    """The params of `_passes` node `n` computed channels-last: a concat's axis and an index's slices move."""
    params = dict(n.params)
    if n.prim == "concat":
        params["axis"] = TO_NHWC.index(n.param("axis"))
    elif n.prim == "index":
        spec = n.param("spec")
        params["spec"] = tuple(spec[a][:3] + (TO_NHWC.index(spec[a][3]),) for a in TO_NHWC)
    return params


WHOLE_VECTORS = 16  # output channels a multiple of this fill every register tile of channels (AVX-512 float32)


def _converts(n: Node) -> bool:
    """A dense NCHW convolution that channels-last is never slower: unpadded 1x1 (a plain matmul over the
    pixels) or with output channels that fill whole vectors (with a ragged count the NCHW gemm, vectors along
    the pixels, ran 1.5-8x faster than direct); or a depthwise one (one output channel per input channel)
    with whole vectors of channels, so that a MobileNet block stays channels-last from end to end."""
    if n.prim != "conv2d" or n.param("layout") != "NCHW":
        return False
    x, w = n.src
    oc, groups = n.shape[1], n.param("groups")
    whole = isinstance(oc, int) and oc % WHOLE_VECTORS == 0
    if groups == 1:
        return whole or w.shape[2] == w.shape[3] == 1 and not any(n.param("pads"))
    return whole and groups == oc == x.shape[1]


def _rewrite(n: Node, held: dict[Node, tuple[Node, bool]], convert: set[Node]) -> tuple[Node, bool]:
    """The new node for `n` and whether it holds n's value channels-last."""
    if n in convert:
        x, w = n.src
        params = dict(n.params, layout="NHWC")
        shape = _permuted(n.shape, TO_NHWC)
        return node("conv2d", shape, n.dtype, (_channels_last(*held[x]), _logical(*held[w])), n.weak, **params), True
    if _passes(n) and any(held[s][1] and s.ndim == 4 for s in n.src):
        src = tuple(_operand(s, held[s]) for s in n.src)
        return node(n.prim, _permuted(n.shape, TO_NHWC), n.dtype, src, n.weak, **_channels_last_params(n)), True
    if n.prim == "reduce" and held[n.src[0]][1] and (axes := _held_axes(n.param("axes"))) is not None:
        # a global pooling: reduced channels-last, the rest comes out in the logical order already
        return node("reduce", n.shape, n.dtype, (held[n.src[0]][0],), n.weak, **dict(n.params, axes=axes)), False
    if not n.src:
        return n, False
    src = tuple(_logical(*held[s]) for s in n.src)
    if all(a is b for a, b in zip(src, n.src)):
        return n, False
    return node(n.prim, n.shape, n.dtype, src, n.weak, **dict(n.params)), False


def _held_axes(axes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The channels-last axes of a reduction over logical `axes`, if the axes it keeps stay in their logical
    order (over H and W, or over C: yes; over N alone: no, C would come last)."""
    moved = tuple(sorted(TO_NHWC.index(a) for a in axes))
    kept = [TO_NHWC[i] for i in range(4) if i not in moved]
    return moved if kept == sorted(kept) else None


def _keeps_axes(n: Node) -> bool:
    """An index of a 4-d array that slices every axis into the same axis of its 4-d result."""
    spec = n.param("spec")
    return n.ndim == 4 and len(spec) == 4 and all(e[0] == "slice" and e[3] == a for a, e in enumerate(spec))


def _operand(s: Node, value: tuple[Node, bool]) -> Node:
    """Operand `s` of a 4-d elementwise op computed channels-last: its channels-last value; a lower-rank operand
    (a (C, 1, 1) bias) first gets numpy's leading ones; a scalar broadcasts as it is."""
    n, is_held = value
    if is_held or n.ndim == 0:
        return n
    if n.ndim < 4:
        n = node("reshape", (1,) * (4 - n.ndim) + tuple(n.shape), n.dtype, (n,), n.weak)
    return transposed(n, TO_NHWC)


def _logical(n: Node, is_held: bool) -> Node:
    return transposed(n, TO_NCHW) if is_held else n


def _channels_last(n: Node, is_held: bool) -> Node:
    return n if is_held else transposed(n, TO_NHWC)


def transposed(n: Node, perm: tuple[int, ...]) -> Node:
    """transpose(n, perm), folded into n when n is itself a transpose (identity: its source) or a scalar
    broadcast (a padding's fill: the scalar broadcast to the permuted shape)."""
    if n.prim == "broadcast" and n.src[0].ndim == 0:
        return node("broadcast", _permuted(n.shape, perm), n.dtype, n.src, n.weak)
    if n.prim == "transpose":
        inner = n.param("perm")
        perm = tuple(inner[p] for p in perm)
        n = n.src[0]
    if perm == tuple(range(len(perm))):
        return n
    return node("transpose", _permuted(n.shape, perm), n.dtype, (n,), n.weak, perm=perm)


def _permuted(shape: tuple, perm: tuple[int, ...]) -> tuple:
    return tuple(shape[p] for p in perm)
