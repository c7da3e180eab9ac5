"""Load-time rewrites of an ONNX graph on its constants, before it is traced.

- `check`: every operator and attribute is one the table (jitop.onnx.ops) knows; else one error listing them all.
- `fold_batch_norm`: a BatchNormalization after a Conv whose weights are initializers becomes the Conv's
  weights and bias (one op and one pass over the activations fewer; what onnxruntime's optimizer does).
"""
from __future__ import annotations

import collections

import numpy as np

from jitop.errors import UnsupportedOperatorError
from jitop.onnx.ops import OPS, OnnxError, batch_norm_affine
from jitop.onnx.proto import Graph, Node

_DOMAINS = ("", "ai.onnx")
_SHOWN = 3  # node names listed per unsupported op type


def check(graph: Graph) -> None:
    """Raise UnsupportedOperatorError naming every unsupported op type (with its count and first nodes), or
    OnnxError naming every attribute a supported op does not understand."""
    missing: dict[str, list[str]] = collections.defaultdict(list)
    for n in graph.nodes:
        key = n.op_type if n.domain in _DOMAINS else f"{n.domain}.{n.op_type}"
        if n.domain not in _DOMAINS or n.op_type not in OPS:
            missing[key].append(n.name)
    if missing:
        raise UnsupportedOperatorError({op: (len(names), names[:_SHOWN]) for op, names in missing.items()},
                                       graph.opset)
    bad = [f"node '{n.name}' ({n.op_type}): attribute '{a}'" for n in graph.nodes
           for a in n.attrs if a not in OPS[n.op_type].attrs]
    if bad:
        raise OnnxError("the model uses attributes jitop does not support: " + "; ".join(bad))


def fold_batch_norm(graph: Graph) -> int:
    """Fold each Conv -> BatchNormalization pair with constant weights and statistics; returns how many."""
    readers = collections.Counter(i for n in graph.nodes for i in n.inputs)
    outputs = {o.name for o in graph.outputs}
    producer = {n.outputs[0]: n for n in graph.nodes if n.outputs}
    consts = graph.initializers
    keep, folded = [], 0
    for n in graph.nodes:
        conv = producer.get(n.inputs[0]) if n.op_type == "BatchNormalization" and n.inputs else None
        if conv is not None and _foldable(conv, n, consts, readers, outputs):
            _fold(conv, n, graph, folded)
            folded += 1
            continue
        keep.append(n)
    graph.nodes = keep
    return folded


def _foldable(conv: Node, bn: Node, consts: dict, readers: collections.Counter, outputs: set) -> bool:
    return (conv.op_type == "Conv" and conv.domain in _DOMAINS and bn.domain in _DOMAINS
            and readers[conv.outputs[0]] == 1 and conv.outputs[0] not in outputs
            and not bn.attrs.get("training_mode", 0) and len([o for o in bn.outputs if o]) == 1
            and all(i in consts for i in conv.inputs[1:] if i) and all(i in consts for i in bn.inputs[1:5])
            and len(bn.inputs) >= 5)


def _fold(conv: Node, bn: Node, graph: Graph, k: int) -> None:
    consts = graph.initializers
    w = consts[conv.inputs[1]]
    scale, bias, mean, var = (consts[i] for i in bn.inputs[1:5])
    mul, shift = batch_norm_affine(scale, bias, mean, var, bn.attrs.get("epsilon", 1e-5), np.dtype(np.float64))
    b = consts[conv.inputs[2]].astype(np.float64) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
    w_name, b_name = f"{conv.name}/bn_weight{k}", f"{conv.name}/bn_bias{k}"
    consts[w_name] = (w.astype(np.float64) * mul.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
    consts[b_name] = (b * mul + shift).astype(w.dtype)
    conv.inputs = [conv.inputs[0], w_name, b_name]
    conv.outputs = [bn.outputs[0]]
