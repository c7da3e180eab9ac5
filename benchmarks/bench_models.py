"""Model benchmarks (issue 10): small models written as plain numpy code, run as numpy, under @jitop.kernel,
and in torch (eager and torch.compile) where installed, in one run.

1. gpt2: a GPT-2-small transformer block on T=128 tokens (prefill), C=768, 12 heads, float32 weights:
   layer norm, x @ w_qkv + b, np.split into q/k/v, a Python loop over the heads of
   softmax(q @ k.T / np.sqrt(d) + mask) @ v with a causal mask, np.hstack of the heads, output projection +
   residual, layer norm, tanh-GELU MLP 768 -> 3072 -> 768 + residual (picoGPT's formulas);
2. decode: the same block for one new token (T=1) with a KV cache of 128 tokens: the token's q/k/v, its
   attention over the 128 cached keys/values and its own, the MLP; returns the new cache too (np.vstack);
3. mlp: a two-layer MLP, batch 256, 1024 -> 4096 -> 1024, ReLU, float32;
4. resnet: ResNet-18's stem max pool (3x3/2, p1) and first basic block (conv3x3-bn-relu-conv3x3-bn + identity,
   relu), batch 1, 64 channels, 112x112 -> 56x56, NCHW, inference batch norm as y * scale + shift. Written with
   jitop.max_pool2d / jitop.conv2d; the numpy peer is the same function with an im2col conv2d
   (common.Im2colConv2d: strided copies + one sgemm) and a max over the 9 strided windows of a -inf-padded copy.
   A second jitop row calls the same function without @jitop.kernel (each jitop op compiled on its own, the
   elementwise steps in numpy);
5. resnet18 / resnet50 (issue 21): whole networks, torchvision's architecture (ResNet-18: basic blocks
   [2, 2, 2, 2]; ResNet-50 v1.5: bottleneck blocks [3, 4, 6, 3], the stride on the 3x3 conv), batch 1,
   3x224x224 -> 1000 classes, NCHW, float32; each batch norm folded into its conv's weight and a per-channel
   bias, ReLU, max pool 3x3/2 p1 after the stem, global average pool (x.mean(axis=(2, 3))), fc (@ w + b).
   Random seeded weights (resnet_params: He init, residual branches scaled so the activations stay O(1)).
   jitop compiles ONE @jitop.kernel(fallback=False) `forward(x, *params)` (ResNet-50: 53 convs incl. the 4
   downsample 1x1s + fc = 108 weight/bias arrays, asserted) written with jitop.conv2d / jitop.max_pool2d and
   numpy; a second row runs the same network as `forward(x, params_list)` (a list argument). Each row checks that
   the function compiled one signature to one executable with no fallback (one_kernel). jitop's first calls are
   cold compiles: JITOP_CACHE_DIR points at a fresh temporary directory for them (the current cache's tuned
   records copied in). numpy: the same function with the im2col conv (+ bias) and the strided max pool; torch:
   torch.nn.functional.conv2d / max_pool2d / relu with the same weights; onnxruntime (where installed): the torch
   function exported by torch.onnx.export to bytes, run with jitop's thread count as intra-op threads (first
   call: export + session creation). Errors are also given against numpy's float64 result.

The numpy code is kept as a user writes it, dtype promotions included: under numpy 2 (NEP 50) np.sqrt(d) and
np.sqrt(2 / np.pi) are np.float64 scalars, so in the GPT-2 blocks the attention scores, everything after them
and the GELU MLP are float64 (float32 weights meet float64 activations); jitop must compute what numpy
computes, float64 included. The MLP (ReLU) stays float32. torch's versions are the same formulas written with
torch ops (torch.nn.functional.layer_norm, torch.softmax, gelu(approximate="tanh"), conv2d, max_pool2d):
torch keeps float32 throughout (a Python float does not promote a float32 tensor), so torch's error against
numpy is larger than jitop's.

Each time is the median of several warm single calls (the first, compiling call excluded; its time is the
"first call" column, measured in this run after jitop's one-time start-up on a tiny kernel). numpy is timed
in a fresh process per OpenBLAS setting (common.run_with_coretype): OPENBLAS_CORETYPE=Haswell and unset
(the kernels OpenBLAS detects). Ratios are peer time / jitop time (> 1: jitop is faster). Each jitop and
torch result is compared once with numpy's result computed in this process: max |y - y_numpy| and that over
max |y_numpy|; a jitop result off by more than 1e-4 * max |y_numpy| (torch: 1e-3), or jitop's result in
another dtype than numpy's, is reported as WRONG and not timed, and the script exits non-zero (as it does
when jitop fails on a model: the error is in its row). The kernels are declared with fallback=False (and
jitop's operators raise instead of falling back), so code that cannot compile shows as unavailable, not as a
numpy time under jitop's name. torch.compile needs a C compiler (inductor): a failure is reported as
"n/a (reason)"; its first call can be served by inductor's on-disk cache from an earlier run.
JITOP_NUM_THREADS and OPENBLAS_NUM_THREADS default to 2 here; torch.set_num_threads follows jitop's thread
count. Under each model's table: jitop's GFLOP/s (matmul/conv flops only) and a short form of what
jitop.explain says (loop nests by root operation, operator template configs, pipeline decisions), and the
slowest loop nests from jitop.profile (a profiling build that reads the cycle counter around each nest).

    python benchmarks/bench_models.py [--quick] [--models gpt2 decode mlp resnet resnet18 resnet50] [--repeat N]
                                      [--skip-torch-compile]

--quick: fewer timed calls (same model sizes).
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import math
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator

THREADS = 2
for _var in ("JITOP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))  # before numpy and jitop load

import numpy as np  # noqa: E402

import jitop  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import CORETYPES, Im2colConv2d, median_time, numpy_label, run_with_coretype, table  # noqa: E402

N_HEAD = 12


# ** the models, as a user writes them in numpy (picoGPT's formulas for GPT-2) **

def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def softmax(x):
    exp_x = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return exp_x / np.sum(exp_x, axis=-1, keepdims=True)


def layer_norm(x, g, b, eps=1e-5):
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.var(x, axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(variance + eps) + b


def multi_head_attention(q, k, v, mask):
    d = q.shape[-1] // N_HEAD
    heads = []
    for i in range(N_HEAD):
        qh, kh, vh = q[:, i * d:(i + 1) * d], k[:, i * d:(i + 1) * d], v[:, i * d:(i + 1) * d]
        heads.append(softmax(qh @ kh.T / np.sqrt(d) + mask) @ vh)
    return np.hstack(heads)


def gpt2_block(x, ln1_g, ln1_b, w_qkv, b_qkv, w_attn, b_attn, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj):
    """A GPT-2 transformer block over a (T, C) sequence (prefill)."""
    T = x.shape[0]
    q, k, v = np.split(layer_norm(x, ln1_g, ln1_b) @ w_qkv + b_qkv, 3, axis=-1)
    causal_mask = (1 - np.tri(T, dtype=x.dtype)) * -1e10
    x = x + multi_head_attention(q, k, v, causal_mask) @ w_attn + b_attn
    return x + gelu(layer_norm(x, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj


def gpt2_decode_step(x, k_cache, v_cache, ln1_g, ln1_b, w_qkv, b_qkv, w_attn, b_attn, ln2_g, ln2_b, w_fc, b_fc,
                     w_proj, b_proj):
    """The block for one new token x (1, C) given the keys and values (S, C) of the S tokens before it;
    returns the token's output and the cache with its key and value appended."""
    q, k, v = np.split(layer_norm(x, ln1_g, ln1_b) @ w_qkv + b_qkv, 3, axis=-1)
    k_cache = np.vstack([k_cache, k])
    v_cache = np.vstack([v_cache, v])
    x = x + multi_head_attention(q, k_cache, v_cache, 0) @ w_attn + b_attn  # mask 0: it sees every token
    return x + gelu(layer_norm(x, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj, k_cache, v_cache


def mlp(x, w1, b1, w2, b2):
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def resnet_block(x, w1, scale1, shift1, w2, scale2, shift2):
    """ResNet-18's stem max pool and first basic block, batch norm folded into scale/shift (C, 1, 1)."""
    x = jitop.max_pool2d(x, 3, stride=2, padding=1)
    y = np.maximum(jitop.conv2d(x, w1, padding=1) * scale1 + shift1, 0)
    y = jitop.conv2d(y, w2, padding=1) * scale2 + shift2
    return np.maximum(y + x, 0)


# numpy's conv2d and max pool for the same block: im2col into buffers allocated once per shape, one sgemm

_IM2COL: dict[tuple, Im2colConv2d] = {}


def numpy_conv2d(x, w, bias=None, stride=1, padding=0):
    key = (x.shape, w.shape, stride, padding, x.dtype)
    if key not in _IM2COL:
        _IM2COL[key] = Im2colConv2d(x.shape, w.shape, stride, padding, dtype=x.dtype)
    y = _IM2COL[key](x, w)
    return y if bias is None else y + bias[:, None, None]


def numpy_max_pool2d(x, k, stride, padding):
    n, c, h, w = x.shape
    oh, ow = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=-np.inf)
    out = None
    for i in range(k):
        for j in range(k):
            window = xp[:, :, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride]
            out = window.copy() if out is None else np.maximum(out, window, out=out)
    return out


def resnet_block_numpy(x, w1, scale1, shift1, w2, scale2, shift2):
    x = numpy_max_pool2d(x, 3, stride=2, padding=1)
    y = np.maximum(numpy_conv2d(x, w1, padding=1) * scale1 + shift1, 0)
    y = numpy_conv2d(y, w2, padding=1) * scale2 + shift2
    return np.maximum(y + x, 0)


# whole ResNets (issue 21): torchvision's ResNet-18 / ResNet-50 at batch 1, batch norm folded into each conv's
# weight and a per-channel bias. One function, written as numpy code; the conv2d / max pool / relu it calls are
# jitop's (the kernel), the im2col ones (numpy) or torch's (torch.nn.functional).

RESNET18_BLOCKS, RESNET50_BLOCKS = (2, 2, 2, 2), (3, 4, 6, 3)


def numpy_relu(x):
    return np.maximum(x, 0)


def resnet(x, params, blocks, bottleneck, conv2d=jitop.conv2d, max_pool2d=jitop.max_pool2d, relu=numpy_relu):
    """torchvision's ResNet (v1.5: a bottleneck's stride is on its 3x3 conv) over folded conv-bn layers.
    params: each conv's weight and bias in the order the network reads them (stem, then per block conv1,
    conv2[, conv3], then its downsample 1x1 if it has one), then the fc layer's weight (C, 1000) and bias."""
    it = iter(params)

    def conv_bn(x, stride, padding, act=True):
        y = conv2d(x, next(it), next(it), stride=stride, padding=padding)
        return relu(y) if act else y
    x = max_pool2d(conv_bn(x, 2, 3), 3, stride=2, padding=1)
    for stage, n_blocks in enumerate(blocks):
        for k in range(n_blocks):
            stride = 2 if k == 0 and stage > 0 else 1
            if bottleneck:
                y = conv_bn(conv_bn(conv_bn(x, 1, 0), stride, 1), 1, 0, act=False)
            else:
                y = conv_bn(conv_bn(x, stride, 1), 1, 1, act=False)
            # torchvision's downsample: a 1x1 conv-bn where the block changes the stride or the channel count
            shortcut = conv_bn(x, stride, 0, act=False) if k == 0 and (stage > 0 or bottleneck) else x
            x = relu(y + shortcut)
    w_fc, b_fc = next(it), next(it)
    if next(it, None) is not None:
        raise ValueError("resnet: more parameters than the network reads")
    return x.mean(axis=(2, 3)) @ w_fc + b_fc


# the jitop kernels: every weight an argument, `forward(x, *params)` (108 arrays for ResNet-50) or a list

def resnet18_forward(x, *params):
    return resnet(x, params, RESNET18_BLOCKS, bottleneck=False)


def resnet50_forward(x, *params):
    return resnet(x, params, RESNET50_BLOCKS, bottleneck=True)


def resnet18_forward_list(x, params_list):
    return resnet(x, params_list, RESNET18_BLOCKS, bottleneck=False)


def resnet50_forward_list(x, params_list):
    return resnet(x, params_list, RESNET50_BLOCKS, bottleneck=True)


def resnet18_numpy(x, *params):
    return resnet(x, params, RESNET18_BLOCKS, False, numpy_conv2d, numpy_max_pool2d)


def resnet50_numpy(x, *params):
    return resnet(x, params, RESNET50_BLOCKS, True, numpy_conv2d, numpy_max_pool2d)


# ** the same models in torch (float32 throughout: torch does not promote a float32 tensor to float64) **

def torch_multi_head_attention(q, k, v, mask):
    import torch
    d = q.shape[-1] // N_HEAD
    heads = []
    for i in range(N_HEAD):
        qh, kh, vh = q[:, i * d:(i + 1) * d], k[:, i * d:(i + 1) * d], v[:, i * d:(i + 1) * d]
        heads.append(torch.softmax(qh @ kh.T / math.sqrt(d) + mask, dim=-1) @ vh)
    return torch.hstack(heads)


def torch_gpt2_block(x, ln1_g, ln1_b, w_qkv, b_qkv, w_attn, b_attn, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj):
    import torch
    F = torch.nn.functional
    T, C = x.shape
    q, k, v = (F.layer_norm(x, (C,), ln1_g, ln1_b, 1e-5) @ w_qkv + b_qkv).split(C, dim=-1)
    causal_mask = torch.triu(torch.full((T, T), -1e10, dtype=x.dtype), 1)
    x = x + torch_multi_head_attention(q, k, v, causal_mask) @ w_attn + b_attn
    return x + F.gelu(F.layer_norm(x, (C,), ln2_g, ln2_b, 1e-5) @ w_fc + b_fc, approximate="tanh") @ w_proj + b_proj


def torch_gpt2_decode_step(x, k_cache, v_cache, ln1_g, ln1_b, w_qkv, b_qkv, w_attn, b_attn, ln2_g, ln2_b, w_fc,
                           b_fc, w_proj, b_proj):
    import torch
    F = torch.nn.functional
    C = x.shape[-1]
    q, k, v = (F.layer_norm(x, (C,), ln1_g, ln1_b, 1e-5) @ w_qkv + b_qkv).split(C, dim=-1)
    k_cache = torch.vstack([k_cache, k])
    v_cache = torch.vstack([v_cache, v])
    x = x + torch_multi_head_attention(q, k_cache, v_cache, 0) @ w_attn + b_attn
    out = x + F.gelu(F.layer_norm(x, (C,), ln2_g, ln2_b, 1e-5) @ w_fc + b_fc, approximate="tanh") @ w_proj + b_proj
    return out, k_cache, v_cache


def torch_mlp(x, w1, b1, w2, b2):
    import torch
    return torch.relu(x @ w1 + b1) @ w2 + b2


def torch_resnet_block(x, w1, scale1, shift1, w2, scale2, shift2):
    import torch
    F = torch.nn.functional
    x = F.max_pool2d(x, 3, stride=2, padding=1)
    y = torch.relu(F.conv2d(x, w1, padding=1) * scale1 + shift1)
    y = F.conv2d(y, w2, padding=1) * scale2 + shift2
    return torch.relu(y + x)


def torch_resnet18(x, *params):
    import torch
    F = torch.nn.functional
    return resnet(x, params, RESNET18_BLOCKS, False, F.conv2d, F.max_pool2d, torch.relu)


def torch_resnet50(x, *params):
    import torch
    F = torch.nn.functional
    return resnet(x, params, RESNET50_BLOCKS, True, F.conv2d, F.max_pool2d, torch.relu)


# ** inputs (the same, from fixed seeds, in this process and in the numpy subprocesses) **

C_GPT2, T_PREFILL, S_CACHE = 768, 128, 128
MLP_SHAPE = (256, 1024, 4096)  # batch, in/out features, hidden
RESNET_C, RESNET_HW = 64, 112  # input of the stem max pool (its output: 56x56)


def gpt2_weights(rng: np.random.Generator, c: int = C_GPT2) -> list[np.ndarray]:
    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ln() -> list[np.ndarray]:
        return [(1 + rng.standard_normal(c) * 0.1).astype(np.float32), normal(c)]
    return [*ln(), normal(c, 3 * c), normal(3 * c), normal(c, c), normal(c),
            *ln(), normal(c, 4 * c), normal(4 * c), normal(4 * c, c), normal(c)]


def args_gpt2() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(10)
    x = rng.standard_normal((T_PREFILL, C_GPT2)).astype(np.float32)
    return (x, *gpt2_weights(rng))


def args_decode() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, C_GPT2)).astype(np.float32)
    k_cache, v_cache = (rng.standard_normal((S_CACHE, C_GPT2)).astype(np.float32) for _ in range(2))
    return (x, k_cache, v_cache, *gpt2_weights(rng))


def args_mlp() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(12)
    b, d, h = MLP_SHAPE
    x = rng.standard_normal((b, d)).astype(np.float32)
    w1 = (rng.standard_normal((d, h)) / math.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((h, d)) / math.sqrt(h)).astype(np.float32)
    b1, b2 = ((rng.standard_normal(n) * 0.1).astype(np.float32) for n in (h, d))
    return x, w1, b1, w2, b2


def args_resnet() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(13)
    c = RESNET_C
    x = rng.standard_normal((1, c, RESNET_HW, RESNET_HW)).astype(np.float32)

    def conv_bn() -> list[np.ndarray]:
        w = (rng.standard_normal((c, c, 3, 3)) * math.sqrt(2 / (9 * c))).astype(np.float32)
        gamma, beta = 1 + 0.1 * rng.standard_normal(c), 0.1 * rng.standard_normal(c)
        mean, var = 0.1 * rng.standard_normal(c), 1 + 0.1 * rng.random(c)
        scale = gamma / np.sqrt(var + 1e-5)  # inference batch norm folded: y * scale + shift
        return [w, scale.astype(np.float32).reshape(c, 1, 1), (beta - mean * scale).astype(np.float32).reshape(c, 1, 1)]
    return (x, *conv_bn(), *conv_bn())


RESNET_IMAGE = (1, 3, 224, 224)  # batch 1, NCHW


def resnet_convs(blocks: tuple[int, ...], bottleneck: bool, hw: int = RESNET_IMAGE[2]
                 ) -> list[tuple[int, int, int, int, str]]:
    """(out channels, in channels, kernel size, output height = width, role) of each conv in the order `resnet`
    reads them (torchvision's widths: 64 * 2**stage, bottlenecks expand 4x); role: stem, branch (inside a
    residual branch), last (a branch's last conv) or downsample."""
    hw = (hw + 2 * 3 - 7) // 2 + 1  # stem 7x7/2
    convs, c = [(64, 3, 7, hw, "stem")], 64
    hw = (hw + 2 - 3) // 2 + 1      # max pool 3x3/2
    for stage, n_blocks in enumerate(blocks):
        mid = 64 * 2 ** stage
        out = 4 * mid if bottleneck else mid
        for k in range(n_blocks):
            stride = 2 if k == 0 and stage > 0 else 1
            o_hw = (hw - 1) // stride + 1
            if bottleneck:
                convs += [(mid, c, 1, hw, "branch"), (mid, mid, 3, o_hw, "branch"), (out, mid, 1, o_hw, "last")]
            else:
                convs += [(mid, c, 3, o_hw, "branch"), (mid, mid, 3, o_hw, "last")]
            if k == 0 and (stage > 0 or bottleneck):
                convs.append((out, c, 1, o_hw, "downsample"))
            c, hw = out, o_hw
    return convs


def resnet_flops(blocks: tuple[int, ...], bottleneck: bool, classes: int = 1000) -> float:
    convs = resnet_convs(blocks, bottleneck)
    return sum(2.0 * oc * ic * k * k * hw * hw for oc, ic, k, hw, _ in convs) + 2.0 * convs[-1][0] * classes


def resnet_params(blocks: tuple[int, ...], bottleneck: bool, seed: int, classes: int = 1000) -> list[np.ndarray]:
    """Random folded conv-bn weights and biases, then the fc layer's: He-normal convs (std sqrt(2 / fan-in),
    so a conv + ReLU keeps the activations' mean square), a residual branch's last conv and each downsample
    scaled by 1/2 (as a batch norm with gamma ~0.5 would: a residual sum then grows ~1.25x per block in mean
    square instead of 2x, and the features stay O(1) after 16 blocks), biases N(0, 0.1^2); fc N(0, 1/C).
    Seeded: the same arrays in every process."""
    rng = np.random.default_rng(seed)
    convs = resnet_convs(blocks, bottleneck)
    params: list[np.ndarray] = []
    for oc, ic, k, _, role in convs:
        std = math.sqrt(2 / (ic * k * k)) * (0.5 if role in ("last", "downsample") else 1.0)
        params += [(rng.standard_normal((oc, ic, k, k)) * std).astype(np.float32),
                   (rng.standard_normal(oc) * 0.1).astype(np.float32)]
    c = convs[-1][0]
    params += [(rng.standard_normal((c, classes)) / math.sqrt(c)).astype(np.float32),
               (rng.standard_normal(classes) * 0.1).astype(np.float32)]
    return params


def args_resnet18() -> tuple[np.ndarray, ...]:
    params = resnet_params(RESNET18_BLOCKS, False, seed=18)
    assert len(params) == 2 * 20 + 2  # 20 convs (3 downsamples) + fc
    x = np.random.default_rng(19).standard_normal(RESNET_IMAGE).astype(np.float32)
    return (x, *params)


def args_resnet50() -> tuple[np.ndarray, ...]:
    params = resnet_params(RESNET50_BLOCKS, True, seed=50)
    assert len(resnet_convs(RESNET50_BLOCKS, True)) == 53 and len(params) == 108  # 53 convs (4 downsamples) + fc
    x = np.random.default_rng(51).standard_normal(RESNET_IMAGE).astype(np.float32)
    return (x, *params)


@dataclass
class Model:
    key: str
    title: str
    numpy_fn: Callable
    jitop_fn: Callable  # the function @jitop.kernel compiles
    torch_fn: Callable
    make_args: Callable[[], tuple[np.ndarray, ...]]
    flops: float  # of the matmuls / convolutions
    numpy_note: str
    eager_jitop_row: bool = False  # also time jitop_fn called directly (jitop ops without @jitop.kernel)
    # a whole network (issue 21): its weights passed as `forward(x, *params)`; list_fn is the same network as
    # `forward(x, params_list)`. Its jitop first call is a cold compile (a fresh JITOP_CACHE_DIR), the kernel
    # must be one compiled signature, its error is also shown against float64, and onnxruntime gets a row.
    list_fn: Callable | None = None


def _gpt2_flops(t: int, s: int, c: int) -> float:
    return 24.0 * t * c * c + 4.0 * t * s * c  # qkv 6TC^2, projection 2TC^2, MLP 16TC^2; q@k.T and @v 4TSC


_RESNET_NUMPY_NOTE = "resnet with im2col conv2d (common.Im2colConv2d) + bias and the strided-window max pool"

MODELS = {
    "gpt2": Model("gpt2", f"GPT-2-small block, prefill T={T_PREFILL}, C={C_GPT2}, {N_HEAD} heads", gpt2_block,
                  gpt2_block, torch_gpt2_block, args_gpt2, _gpt2_flops(T_PREFILL, T_PREFILL, C_GPT2),
                  "the function as written"),
    "decode": Model("decode", f"GPT-2-small block, decode T=1 with a KV cache of {S_CACHE}, C={C_GPT2}",
                    gpt2_decode_step, gpt2_decode_step, torch_gpt2_decode_step, args_decode,
                    _gpt2_flops(1, S_CACHE + 1, C_GPT2), "the function as written"),
    "mlp": Model("mlp", f"two-layer MLP, batch {MLP_SHAPE[0]}, {MLP_SHAPE[1]} -> {MLP_SHAPE[2]} -> {MLP_SHAPE[1]}, "
                 "ReLU, float32", mlp, mlp, torch_mlp, args_mlp, 4.0 * MLP_SHAPE[0] * MLP_SHAPE[1] * MLP_SHAPE[2],
                 "the function as written"),
    "resnet": Model("resnet", f"ResNet-18 stem max pool + first basic block, batch 1, {RESNET_C}x{RESNET_HW}x"
                    f"{RESNET_HW} -> {RESNET_C}x{RESNET_HW // 2}x{RESNET_HW // 2}, NCHW, float32", resnet_block_numpy,
                    resnet_block, torch_resnet_block, args_resnet,
                    2 * 2.0 * RESNET_C * RESNET_C * 9 * (RESNET_HW // 2) ** 2,
                    "resnet_block_numpy: im2col conv2d (common.Im2colConv2d) and a strided-window max pool",
                    eager_jitop_row=True),
    "resnet18": Model("resnet18", "ResNet-18 (torchvision's, batch norm folded into the convs), batch 1, "
                      "3x224x224 -> 1000, NCHW, float32, 42 weight/bias arrays as forward(x, *params)",
                      resnet18_numpy, resnet18_forward, torch_resnet18, args_resnet18,
                      resnet_flops(RESNET18_BLOCKS, False), _RESNET_NUMPY_NOTE, list_fn=resnet18_forward_list),
    "resnet50": Model("resnet50", "ResNet-50 (torchvision's v1.5, batch norm folded into the convs), batch 1, "
                      "3x224x224 -> 1000, NCHW, float32, 108 weight/bias arrays as forward(x, *params)",
                      resnet50_numpy, resnet50_forward, torch_resnet50, args_resnet50,
                      resnet_flops(RESNET50_BLOCKS, True), _RESNET_NUMPY_NOTE, list_fn=resnet50_forward_list),
}


# ** measuring **

def numpy_times(key: str, repeat: int) -> tuple[float, float]:
    """(median, best) seconds of the numpy model in this process (run by the subprocesses)."""
    model = MODELS[key]
    args = model.make_args()
    return median_time(lambda: model.numpy_fn(*args), repeat)


_NUMPY_MODEL = """
import json, sys
from bench_models import numpy_times
print(json.dumps(numpy_times(sys.argv[1], int(sys.argv[2]))))
"""

SETTLE_S = 0.2  # idle before each library's turn: the previous library's spinning worker threads go to sleep


def settle() -> None:
    time.sleep(SETTLE_S)


def reason(e: BaseException) -> str:
    if isinstance(e, ImportError):
        return f"{e.name or 'module'} not installed"
    first = (str(e).strip().splitlines() or [""])[0]
    first = first if len(first) <= 120 else first[:117] + "..."
    return f"{type(e).__name__}: {first}".rstrip(": ").replace("|", "/")


def leaves(y: Any) -> list[np.ndarray]:
    if isinstance(y, (tuple, list)):
        return [a for v in y for a in leaves(v)]
    return [y.detach().numpy() if hasattr(y, "detach") else np.asarray(y)]


def errors(got: Any, ref: Any) -> tuple[float, float, str, bool]:
    """(max abs error, that over max |ref|, the result's dtypes, whether they are numpy's) over every array of
    the result."""
    g, r = leaves(got), leaves(ref)
    if len(g) != len(r) or any(a.shape != b.shape for a, b in zip(g, r)):
        shapes = ", ".join(str(a.shape) for a in g)
        return math.inf, math.inf, f"shape {shapes} (numpy: {', '.join(str(b.shape) for b in r)})", False
    err = max(float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) for a, b in zip(g, r))
    scale = max(float(np.abs(b.astype(np.float64)).max()) for b in r)
    same = all(a.dtype == b.dtype for a, b in zip(g, r))
    dtypes = ", ".join(str(a.dtype) for a in g)
    note = f"dtype {dtypes} (as numpy)" if same else f"dtype {dtypes} (numpy: {', '.join(str(b.dtype) for b in r)})"
    return err, err / max(scale, 1e-30), note, same


@dataclass
class Row:
    label: str
    median: Any = None  # seconds, or why there is no time (str)
    best: float | None = None
    first: float | None = None  # seconds of the first call
    abs_err: float | None = None
    rel_err: float | None = None
    note: str = ""


def measure(label: str, make: Callable[[], Callable[[], Any]], ref: Any, tol: float, repeat: int,
            first_call: bool = True, numpy_dtypes: bool = True, ref64: Any = None) -> Row:
    """Build the call, time its first call, check it against `ref` (values within `tol` * max |ref|, and with
    `numpy_dtypes` numpy's dtypes), then time `repeat` warm calls. With `ref64` (numpy's result in float64), the
    note also gives the result's error against it."""
    try:
        settle()
        call = make()
        t0 = time.perf_counter()
        got = call()
        first = time.perf_counter() - t0
        e, rel, note, same_dtypes = errors(got, ref)
        if ref64 is not None:
            note += f"; err / max abs vs float64: {errors(got, ref64)[1]:.1e}"
        del got  # a big jitop output is recycled by the next call only once nobody holds it
        row = Row(label, first=first if first_call else None, abs_err=e, rel_err=rel, note=note)
        if not rel <= tol:
            row.median = f"WRONG (max abs err {e:.1e}, {rel:.1e} of max /numpy/ > {tol:.0e}), not timed"
            return row
        if numpy_dtypes and not same_dtypes:
            row.median = "WRONG (not numpy's dtype), not timed"
            return row
        row.median, row.best = median_time(call, repeat)
        return row
    except Exception as ex:  # missing, cannot compile here, or fails
        return Row(label, median=f"n/a ({reason(ex)})")


def fmt_ms(v: Any) -> str:
    return f"{v * 1e3:.2f}" if isinstance(v, float) else ("" if v is None else str(v))


def fmt_err(v: float | None) -> str:
    return "" if v is None else f"{v:.1e}"


def ratio(peer: Any, jit: Any) -> str:
    return f"{peer / jit:.2f}" if isinstance(peer, float) and isinstance(jit, float) else "n/a"


# ** what jitop compiled: fusion groups from jitop.explain **

_NODE = re.compile(r"^\s+(%\d+) = (\w+)\(.*\) : (\w+)(\[[\d, ]*\])$")
_GROUP = re.compile(r"^\s+(\S+): inlines (.*); ends because: (.*)$")


def stages_summary(f: Any, args: tuple) -> str:
    """A short form of what jitop.explain says about the compiled function: its loop nests (fusion groups)
    counted by operation, dtype and shape, the operator templates and their configs, the pipeline decisions."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        text = jitop.explain(f, *args)
    lines = text.splitlines()
    nodes = {m.group(1): (m.group(2), m.group(3), m.group(4)) for ln in lines if (m := _NODE.match(ln))}

    def section(title: str) -> list[str]:
        try:
            start = next(i for i, ln in enumerate(lines) if ln.startswith(title))
        except StopIteration:
            return []
        out = []
        for ln in lines[start + 1:]:
            if not ln.startswith("  "):
                break
            out.append(ln.strip())
        return out

    groups = [m for ln in section("fusion groups") if (m := _GROUP.match("  " + ln))]
    kinds: Counter = Counter()
    for g in groups:
        prim, dtype, shape = nodes.get(g.group(1), ("output", "", ""))
        kinds[f"{prim} {dtype}{shape}"] += 1
    out = [f"{len(groups)} loop nests (fusion groups), by root operation:"]
    out += [f"  {n} x {k}" for k, n in kinds.most_common()]
    templates = section("operator templates")
    if templates:
        tcount = Counter(re.sub(r"\(one of .*$", "", t).split(": ", 1)[-1].strip() for t in templates)
        out.append(f"{len(templates)} operator template instances (task configs):")
        out += [f"  {n} x {t}" for t, n in tcount.most_common()]
    decisions = Counter(section("pipeline decisions"))  # in first-seen order
    if decisions:
        out.append("pipeline decisions:")
        out += [f"  {n} x {d if len(d) <= 200 else d[:197] + '...'}" for d, n in decisions.items()]
    return "\n".join(out)


# ** whole networks: a cold first compile, one kernel, onnxruntime **

@contextlib.contextmanager
def fresh_cache_dir() -> Iterator[str]:
    """JITOP_CACHE_DIR set to a new, empty directory meanwhile, so every kernel compiled in it is a cold compile
    (the disk cache cannot serve it); the current cache's tuned records are copied in, so the compile picks the
    schedules it would pick anyway. The directory is removed at exit, after the store's own exit flush."""
    from jitop import cachedir
    tuned = list(cachedir.store().items("tuned/"))
    directory = tempfile.mkdtemp(prefix="jitop-bench-cold-")
    atexit.register(shutil.rmtree, directory, True)
    old = os.environ.get("JITOP_CACHE_DIR")
    os.environ["JITOP_CACHE_DIR"] = directory
    try:
        store = cachedir.store()
        for key, value in tuned:
            store.put(key, value)
        yield directory
    finally:
        if old is None:
            os.environ.pop("JITOP_CACHE_DIR", None)
        else:
            os.environ["JITOP_CACHE_DIR"] = old


def one_kernel(f: Any) -> tuple[bool, str]:
    """(whether the kernel function compiled exactly one signature into one compiled executable, with no
    fallback to numpy, what it did): what 'the network compiles as one kernel' means."""
    from jitop.dispatch import Overload
    entries = list(f.cache.values())
    if f.misses == 1 and len(entries) == 1 and isinstance(entries[0], Overload):
        lookup = entries[0].lookup
        disk = f"disk cache: {lookup.status}" if lookup is not None else "no disk cache"
        return True, f"one kernel: 1 signature compiled to 1 executable, no fallback ({disk})"
    kinds = ", ".join("compiled" if isinstance(e, Overload) else "numpy fallback" for e in entries)
    return False, f"NOT ONE KERNEL: {f.misses} compiles, cache entries: {kinds or 'none'}"


def onnxruntime_call(torch: Any, torch_fn: Callable, targs: list) -> Callable[[], Any]:
    """The torch function exported to ONNX (torch.onnx.export to bytes; the weights as initializers, the image
    the only input) and run by onnxruntime's CPU provider with jitop's thread count as intra-op threads. The
    export and the session's creation (its graph optimizations) happen in the first call, like a compile."""
    import onnxruntime as ort
    state: dict[str, Callable[[], Any]] = {}

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for k, p in enumerate(targs[1:]):
                self.register_buffer(f"p{k}", p)

        def forward(self, x: Any) -> Any:
            return torch_fn(x, *(getattr(self, f"p{k}") for k in range(len(targs) - 1)))

    def build() -> Callable[[], Any]:
        buf = io.BytesIO()
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript-based exporter is deprecated (the other needs onnxscript)
            try:
                torch.onnx.export(Net().eval(), (targs[0],), buf, dynamo=False)
            except Exception:
                buf = io.BytesIO()
                torch.onnx.export(Net().eval(), (targs[0],), buf, dynamo=True)
        from jitop import config
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = config.num_threads(), 1
        sess = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: targs[0].numpy()}
        return lambda: sess.run(None, feed)[0]

    def call() -> Any:
        run = state.get("run")
        if run is None:
            run = state["run"] = build()
        return run()
    return call


# ** one model **

def run_model(model: Model, repeat: int, torch_compile: bool, torch: Any) -> tuple[str, list, bool]:
    """The model's section, its summary row, and whether jitop ran and was right (numpy's values and dtypes)."""
    args = model.make_args()
    ref = model.numpy_fn(*args)
    np_labels = [numpy_label(core, short=True) for _, core in CORETYPES]
    whole = model.list_fn is not None
    ref64, np_note = None, model.numpy_note
    if whole:  # how far each float32 result is from the exact one (numpy's float32 error included)
        ref64 = model.numpy_fn(*(a.astype(np.float64) for a in args))
        np_note += f"; numpy float32's err / max abs vs float64: {errors(ref, ref64)[1]:.1e}"
    failures: list[str] = []

    rows: list[Row] = []
    f = jitop.kernel(model.jitop_fn, fallback=False)
    with fresh_cache_dir() if whole else contextlib.nullcontext():
        jit = measure("jitop.kernel" + (", forward(x, *params)" if whole else ""), lambda: (lambda: f(*args)), ref,
                      JITOP_TOL, repeat, ref64=ref64)
        rows.append(jit)
        if whole:
            ok, what = one_kernel(f)
            jit.note += f"; first call: trace + cold compile (fresh JITOP_CACHE_DIR); {what}"
            if not ok:
                failures.append(what)
            fl = jitop.kernel(model.list_fn, fallback=False)
            x, params_list = args[0], list(args[1:])
            row = measure("jitop.kernel, forward(x, params_list)", lambda: (lambda: fl(x, params_list)), ref,
                          JITOP_TOL, repeat, ref64=ref64)
            ok, what = one_kernel(fl)
            row.note += f"; first call: trace + compile in the same fresh JITOP_CACHE_DIR; {what}"
            if not ok:
                failures.append(what)
            rows.append(row)
    if model.eager_jitop_row:
        rows.append(measure("jitop ops, no @jitop.kernel", lambda: (lambda: model.jitop_fn(*args)), ref, JITOP_TOL,
                            repeat))
    for (_, core), label in zip(CORETYPES, np_labels):
        settle()
        try:
            med, best = run_with_coretype(_NUMPY_MODEL, [model.key, repeat], core)
            rows.append(Row(label, med, best, note=np_note))
        except Exception as ex:
            rows.append(Row(label, f"n/a ({reason(ex)})"))
    if torch is None:
        rows += [Row("torch eager", "n/a (torch not installed)"), Row("torch.compile", "n/a (torch not installed)")]
    else:
        targs = [torch.from_numpy(a) for a in args]

        def eager() -> Callable[[], Any]:
            def call():
                with torch.inference_mode():
                    return model.torch_fn(*targs)
            return call

        def compiled() -> Callable[[], Any]:
            fn = torch.compile(model.torch_fn)

            def call():
                with torch.inference_mode():
                    return fn(*targs)
            return call
        rows.append(measure("torch eager", eager, ref, TORCH_TOL, repeat, first_call=False, numpy_dtypes=False,
                            ref64=ref64))
        if torch_compile:
            rows.append(measure("torch.compile", compiled, ref, TORCH_TOL, repeat, numpy_dtypes=False, ref64=ref64))
        else:
            rows.append(Row("torch.compile", "n/a (skipped: --skip-torch-compile)"))
    if whole:
        label = "onnxruntime"
        try:
            import onnxruntime
            label = f"onnxruntime {onnxruntime.__version__}"
        except ImportError:
            rows.append(Row(label, "n/a (not installed)"))
        else:
            if torch is None:
                rows.append(Row(label, "n/a (torch not installed: nothing to export)"))
            else:
                row = measure(label, lambda: onnxruntime_call(torch, model.torch_fn, targs), ref, TORCH_TOL, repeat,
                              numpy_dtypes=False, ref64=ref64)
                row.note += "; the torch function exported with torch.onnx.export; first call: export + session"
                rows.append(row)

    jm = jit.median
    body = [[r.label, fmt_ms(r.median), fmt_ms(r.best), ratio(r.median, jm) if r is not jit else "1.00",
             fmt_ms(r.first), fmt_err(r.abs_err), fmt_err(r.rel_err), r.note] for r in rows]
    text = (f"### {model.title}\n\n"
            + table(["implementation", "ms (median)", "ms (best)", "time / jitop.kernel time", "first call ms",
                     "max abs err vs numpy", "err / max abs numpy", "notes"], body))
    if isinstance(jm, float):
        text += f"\n\njitop.kernel: {model.flops / jm / 1e9:.1f} GFLOP/s ({model.flops / 1e9:.2f} GFLOP of matmul/conv)"
        try:
            text += ("\n\nWhat jitop compiled (short form of jitop.explain):\n\n```\n" + stages_summary(f, args)
                     + "\n```")
        except Exception as ex:
            text += f"\n\njitop.explain failed: {reason(ex)}"
        try:  # where the time goes: a profiling build (cycle counters around each loop nest)
            text += ("\n\nTop loop nests by time (jitop.profile, a profiling build):\n\n```\n"
                     + jitop.profile(f, *args, repeat=max(3, repeat // 2)).top(8) + "\n```")
        except Exception as ex:
            text += f"\n\njitop.profile failed: {reason(ex)}"
    if failures:
        text += "\n\n" + "\n".join(f"FAILED: {what}" for what in failures)
    by = {r.label: r for r in rows}
    ort_row = next((r for r in rows if r.label.startswith("onnxruntime")), None)
    summary = [model.key, fmt_ms(jm), fmt_ms(jit.first),
               *(ratio(by[lbl].median, jm) for lbl in np_labels),
               ratio(by["torch eager"].median, jm), ratio(by["torch.compile"].median, jm),
               ratio(ort_row.median, jm) if ort_row is not None else "n/a",
               fmt_err(jit.abs_err), fmt_err(jit.rel_err)]
    jitop_ok = all(isinstance(r.median, float) for r in rows if r.label.startswith("jitop")) and not failures
    return text, summary, jitop_ok


# The tolerances are relative to max |y_numpy|. 1e-4 also holds for the whole ResNets, by this estimate: a
# K-term dot product in float32 has a rounding error of at most gamma_K = K*U (U = 2**-24) of the sum of its
# absolute terms, and typically (independent roundings) ~sqrt(K)*U of that sum, which for terms of random sign is
# ~sqrt(K) times the result: ~sqrt(K)*U relative per layer, summed in any order. The residual nets here keep the
# activations' scale (resnet_params), so each layer's relative error reaches the output at about its size and the
# errors of L layers add in quadrature: ~sqrt(L*K)*U relative to the output's RMS; for ResNet-50, L = 54 (53 convs
# and the fc) and K <= 4608 (3x3x512): sqrt(54*4608)*U = 3e-5, and the max error relative to max |y| is about that
# again (both maxima over the same 1000 outputs). Two float32 results (jitop's, numpy's) differ by ~sqrt(2) of it:
# ~4e-5 < 1e-4, so the rule stays, with 2.4x slack; a dropped layer or a wrong index moves y by O(1) of max |y|,
# far above it. (The worst-case bound, gamma_K per layer propagated through |W|, grows ~sqrt(K) per layer for
# signed weights: useless past a few layers, so no first-order bound as in tests/graph/test_deep_programs.py,
# which uses nonnegative weights for that reason.) Measured: numpy float32 and jitop are ~5e-7 of max |y| from
# the float64 result (blocked sums with FMA do better than the estimate); the whole-model rows print it.
JITOP_TOL, TORCH_TOL = 1e-4, 1e-3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer timed calls (5 instead of 20), same sizes")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--repeat", type=int, default=None, help="timed calls per implementation (median reported)")
    p.add_argument("--skip-torch-compile", action="store_true", help="do not run torch.compile (slow first calls)")
    args = p.parse_args()
    repeat = args.repeat or (5 if args.quick else 20)

    from bench_ops import BUSY_LIMIT, BUSY_WARNING, busy_text, print_end_of_run, strict_ops
    from common import busy_cores, machine, versions
    from jitop import config
    strict_ops()  # jitop's operators raise instead of running as numpy
    try:
        import torch
        torch.set_num_threads(config.num_threads())
    except ImportError:
        torch = None

    start = time.perf_counter()
    busy = busy_cores()
    quick = f" (--quick: {repeat} timed calls)" if args.quick else ""
    print(f"Model benchmarks (issue 10){quick} — {machine()}; OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS')}, JITOP_NUM_THREADS={os.environ.get('JITOP_NUM_THREADS')}, "
          f"torch threads={torch.get_num_threads() if torch is not None else 'n/a'}; {versions('torch', 'llvmlite')}; "
          f"1-min load average at start {os.getloadavg()[0]:.2f}; {busy_text(busy)} at start\n", flush=True)
    if busy is not None and busy > BUSY_LIMIT:
        print(BUSY_WARNING + "\n", flush=True)
    print(f"Times are the median (and best) of {repeat} warm calls; ratios are the peer's median over jitop.kernel's "
          "(> 1: jitop is faster). numpy runs in a fresh process per OPENBLAS_CORETYPE setting. Errors are against "
          "numpy's result; the dtype promotions are numpy 2's (float64 from np.sqrt(d) on in the GPT-2 blocks), "
          "torch computes in float32.\n", flush=True)

    t0 = time.perf_counter()
    jitop.kernel(lambda a: a + 1)(np.ones(4, np.float32))  # jitop's one-time start-up, not in any first call
    print(f"jitop start-up (LLVM, thread pool) on a tiny kernel: {(time.perf_counter() - t0) * 1e3:.0f} ms\n",
          flush=True)

    summaries, wrong = [], []
    for key in args.models:
        text, summary, ok = run_model(MODELS[key], repeat, not args.skip_torch_compile, torch)
        print(text + "\n", flush=True)
        summaries.append(summary)
        if not ok:
            wrong.append(key)
    np_labels = [numpy_label(core, short=True) for _, core in CORETYPES]
    print("### Summary\n\n" + table(["model", "jitop.kernel ms", "jitop first call ms",
                                     *(f"{lbl} / jitop" for lbl in np_labels), "torch eager / jitop",
                                     "torch.compile / jitop", "onnxruntime / jitop", "jitop max abs err",
                                     "jitop err / max abs numpy"],
                                    summaries) + "\n")
    print_end_of_run(start)
    if wrong:
        raise SystemExit(f"jitop failed or gave a wrong result on: {', '.join(wrong)} (see the rows above)")


if __name__ == "__main__":
    main()
