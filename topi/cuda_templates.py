"""The GPU GEMM schedules as templates: "cuda.matmul" (topi.cuda.matmul + schedule_matmul), "cuda.gemv" (a
product of few rows: topi.cuda_gemv) and "cuda.conv2d" (topi.cuda.conv2d_nchw + schedule_conv2d), registered
with jitop.tuner.registry like the CPU templates, so `jitop.tune` searches their spaces (topi.cuda_space,
topi.cuda_gemv.gemv_space) for a GPU Target and measures them on the GPU (jitop.tuner.measure_gpu).

Their tasks are (workload, CudaTarget): a record tuned for one GPU Target (its architecture and limits, the
Target's key) is never used for another architecture or a CPU. `schedule_matmul(C)` / `schedule_conv2d(Y)`
without a cfg ask `tuned_cfg`, i.e. `pick`, as a CPU compile does: records applied with jitop.apply_records
or tuned into the cache answer first, the template's default otherwise.

The traced graph's GPU path (jitop.graph.gpu) computes its 2-D float32 matmuls and its NCHW float32
convolutions with the templates' `compute` and `schedule` (so their tuned records apply to
`@jitop.kernel(target="cuda")` and to ONNX models on the GPU too): the operands, read through the graph's readers
(producers fused into them), are computed in the shared tiles' fill; an elementwise epilogue (bias, activation,
residual) is computed from the register tile and written in the output's place.

>>> from jitop.target import Target
>>> from jitop.tuner.task import Task
>>> task = Task("cuda.matmul", CudaMatmulWorkload(1024, 1024, 1024), Target.from_string("cuda -arch=sm_90"))
>>> len(task.config_space()) > 100, task.workload.describe()
(True, 'cuda.matmul 1024x1024x1024 float32')
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from jitop import te
from jitop.dtypes import as_dtype
from jitop.schedule.schedule import Schedule
from jitop.target import CudaTarget
from jitop.topi import cuda, cuda_gemv
from jitop.topi.cuda_mma import MODES, tc_available, tc_tolerance
from jitop.topi.cuda_space import gemm_space, launchable_default, to_cfg, to_config
from jitop.tuner import registry
from jitop.tuner.space import Config, ConfigSpace
from jitop.tuner.task import Task, pick

DTYPE = "float32"  # the GEMM templates' shared tiles are sized for 4-byte elements


@dataclass(frozen=True)
class CudaMatmulWorkload:
    """C[m, n] = A[m, k] @ B[k, n] in float32 on a GPU; precision "tf32" / "bf16" opts into TF32 / BF16 tensor cores
    (its space has the "tc" knob [0, precision] on sm_80+, and its records are its own: a "float32" workload's
    tuning never changes its numerics, as torch leaves TF32 off for matmuls unless asked). A string: records hold
    ints and strings."""

    template: ClassVar[str] = "cuda.matmul"
    default_cfg: ClassVar[Callable[..., dict[str, int]]] = staticmethod(cuda.default_matmul_config)
    m: int
    n: int
    k: int
    dtype: str = DTYPE
    precision: str = "float32"

    def __post_init__(self) -> None:
        if self.precision != "float32" and self.precision not in MODES:
            raise ValueError(f"CudaMatmulWorkload: precision={self.precision!r}; expected one of "
                             f"{['float32', *MODES]}")

    @property
    def tc_mode(self) -> str:
        """The tensor-core mode that may compute it ("tf32", "bf16"; "" for float32)."""
        return "" if self.precision == "float32" else self.precision

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(rows, columns, reduction) of the GEMM."""
        return self.m, self.n, self.k

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def tolerance(self, config: Config) -> tuple[float, float] | None:
        """The (rtol, atol fraction of max|reference|) the tuner checks `config`'s output with against the
        default's (float32) output: the mode's (`topi.cuda_mma.tc_tolerance`) for a tensor-core point, None (the
        measurer's float32 one) otherwise."""
        mode = config.as_dict().get("tc", 0)
        return tc_tolerance(mode, self.k) if mode else None

    def describe(self) -> str:
        """"cuda.matmul 1024x1024x1024 float32" (" tf32" / " bf16" added where tensor cores are allowed)."""
        return f"cuda.matmul {self.m}x{self.n}x{self.k} {self.dtype}" + (f" {self.tc_mode}" if self.tc_mode else "")

    @staticmethod
    def from_cpu(wl: Any) -> "CudaMatmulWorkload | None":
        """The GPU workload of a CPU "matmul" workload (None: the GPU template does not take it: B batched,
        symbolic, or not float32). A batched A times an unbatched B is one GEMM whose rows are A's batches'
        rows stacked (a transformer's dense layers: [batch, tokens, k] @ [k, n]).

        >>> from types import SimpleNamespace as W
        >>> CudaMatmulWorkload.from_cpu(W(m=128, n=768, k=3072, dtype="float32", a_batch=(8,), b_batch=()))
        CudaMatmulWorkload(m=1024, n=768, k=3072, dtype='float32', precision='float32')
        """
        sizes = (wl.m, wl.n, wl.k, *wl.a_batch)
        if wl.b_batch or wl.dtype != DTYPE or not all(isinstance(d, int) and d > 0 for d in sizes):
            return None
        return CudaMatmulWorkload(wl.m * math.prod(wl.a_batch), wl.n, wl.k)


@dataclass(frozen=True)
class CudaGemvWorkload:
    """C[m, n] = A[m, k] @ B[k, n] in float32 of a few rows (m <= topi.cuda_gemv.GEMV_ROWS: a decode step's
    dense layers)."""

    template: ClassVar[str] = "cuda.gemv"
    m: int
    n: int
    k: int
    dtype: str = DTYPE

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def describe(self) -> str:
        """"cuda.gemv 1x768x2304 float32"."""
        return f"cuda.gemv {self.m}x{self.n}x{self.k} {self.dtype}"

    @staticmethod
    def from_cpu(wl: Any) -> "CudaGemvWorkload | None":
        """The GEMV workload of a CPU "matmul" workload of constant sizes, B unbatched, float32 and at most
        GEMV_ROWS rows (a batched A's rows stacked); None otherwise.

        >>> from types import SimpleNamespace as W
        >>> CudaGemvWorkload.from_cpu(W(m=1, n=768, k=3072, dtype="float32", a_batch=(), b_batch=()))
        CudaGemvWorkload(m=1, n=768, k=3072, dtype='float32')
        >>> CudaGemvWorkload.from_cpu(W(m=5, n=768, k=3072, dtype="float32", a_batch=(), b_batch=())) is None
        True
        """
        gemm = CudaMatmulWorkload.from_cpu(wl)
        if gemm is None or gemm.m > cuda_gemv.GEMV_ROWS:
            return None
        return CudaGemvWorkload(gemm.m, gemm.n, gemm.k, gemm.dtype)


@dataclass(frozen=True)
class CudaConv2dWorkload:
    """Y [n, k, p, q] = conv2d(X [n, c, h, w], W [k, c, r, s]) in float32 on a GPU, NCHW, groups = 1."""

    template: ClassVar[str] = "cuda.conv2d"
    default_cfg: ClassVar[Callable[..., dict[str, int]]] = staticmethod(cuda.default_conv2d_config)
    symbolic_batch: ClassVar[int] = cuda.SYMBOLIC_BATCH  # the batch a symbolic one's task (config) is decided at
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    dtype: str = DTYPE

    @property
    def out_hw(self) -> tuple[int, int]:
        """(P, Q): the output's height and width."""
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        p = (self.h + 2 * ph - dh * (self.r - 1) - 1) // sh + 1
        return p, (self.w + 2 * pw - dw * (self.s - 1) - 1) // sw + 1

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(rows, columns, reduction) of the implicit GEMM: K, N*P*Q, C*R*S."""
        p, q = self.out_hw
        return self.k, self.n * p * q, self.c * self.r * self.s

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.gemm)

    def describe(self) -> str:
        """"cuda.conv2d 8x64x56x56 k64 3x3/1 pad1 float32"."""
        return (f"cuda.conv2d {self.n}x{self.c}x{self.h}x{self.w} k{self.k} {self.r}x{self.s}/{self.stride[0]} "
                f"pad{self.padding[0]} {self.dtype}")

    @staticmethod
    def from_cpu(wl: Any) -> "CudaConv2dWorkload | None":
        """The GPU workload of a CPU "conv2d" workload (None where the GPU template does not take it: grouped,
        NHWC, asymmetric padding, symbolic sizes, not float32)."""
        top, bottom, left, right = wl.pads
        sizes = (wl.n, wl.c, wl.h, wl.w, wl.oc, wl.kh, wl.kw)
        if wl.groups != 1 or wl.layout != "NCHW" or wl.dtype != DTYPE or top != bottom or left != right \
                or not all(isinstance(d, int) for d in sizes):
            return None
        return CudaConv2dWorkload(*sizes, stride=tuple(wl.stride), padding=(top, left), dilation=tuple(wl.dilation))


def _check_target(template: str, target: Any) -> CudaTarget:
    if not isinstance(target, CudaTarget):
        raise TypeError(f"template '{template}' builds for a GPU (a CudaTarget such as "
                        f"jitop.Target('cuda -arch=sm_90')), got {target!r}")
    return target


# ** the space and default of either GEMM (a workload's `gemm` triple and `default_cfg`) **

def _default_cfg(wl: "CudaMatmulWorkload | CudaConv2dWorkload", target: Any) -> dict[str, int]:
    target = _check_target(wl.template, target)
    return launchable_default(wl.default_cfg(*wl.gemm, target), target)


def _tensor_cores(wl: "CudaMatmulWorkload | CudaConv2dWorkload", target: CudaTarget) -> str:
    # the tc knob's mode ("": none): a matmul that allows TF32 or BF16 (cuda.conv2d has no tensor-core schedule),
    # on sm_80+ in float32
    mode = getattr(wl, "tc_mode", "")
    return mode if mode and tc_available(target, wl.dtype) else ""


def gemm_config_space(wl: "CudaMatmulWorkload | CudaConv2dWorkload", target: CudaTarget) -> ConfigSpace:
    """Every launchable config of the workload's GEMM on `target` (topi.cuda_space.gemm_space); a matmul that
    allows TF32 or BF16 has the tensor-core knob "tc" on sm_80+ (its points checked with `tc_tolerance`)."""
    return gemm_space(*wl.gemm, target, _default_cfg(wl, target), _tensor_cores(wl, _check_target(wl.template,
                                                                                                 target)))


def gemm_default(wl: "CudaMatmulWorkload | CudaConv2dWorkload", target: CudaTarget) -> Config:
    """The template's default (`topi.cuda.default_matmul_config` / `default_conv2d_config`) as a point of the
    space (a smaller tile where `target` cannot launch it: topi.cuda_space.launchable_default); tensor cores
    off (tc = 0): float32 numerics unless the tuner finds and checks a tensor-core point."""
    return to_config(_default_cfg(wl, target), bool(_tensor_cores(wl, _check_target(wl.template, target))))


# ** cuda.matmul **

def matmul_build(wl: CudaMatmulWorkload, config: Config, target: CudaTarget,
                 prepacked: bool = False) -> tuple[Schedule, list[te.Tensor]]:
    """Placeholders A, B and the product C, scheduled with `config`: (Schedule, [A, B, C])."""
    A = te.placeholder((wl.m, wl.k), wl.dtype, name="A")
    B = te.placeholder((wl.k, wl.n), wl.dtype, name="B")
    cfg = to_cfg(config)
    C = cuda.matmul(A, B, tc=cfg.get("tc", 0))
    return cuda.schedule_matmul(C, cfg, _check_target("cuda.matmul", target)), [A, B, C]


@dataclass(frozen=True)
class GemmStages:
    """What a template's `compute` returns (`matmul_compute`, `conv2d_compute`): the output `out` and the views of
    its two operands that read the graph's (inlined by its `schedule` into the shared tiles' fill)."""

    out: te.Tensor
    operands: tuple[te.Tensor, te.Tensor]


def _schedule_in_graph(template: str, schedule_stage: Callable, s: Schedule, t: GemmStages, cfg: dict[str, Any],
                       target: CudaTarget, epilogue: te.Tensor | None) -> None:
    """`schedule_stage` (topi.cuda's) with `cfg` on a template's stages inside the graph's schedule `s`, the
    operand views inlined into the shared tiles' fill; an elementwise `epilogue` of the output's shape (bias,
    activation, residual) is computed from the register tile and written instead of the output."""
    schedule_stage(s, t.out, cfg, _check_target(template, target), epilogue)
    for view in t.operands:
        s[view].compute_inline()


def matmul_compute(wl: CudaMatmulWorkload, config: Config, target: CudaTarget, readers: tuple[Callable, Callable],
                   name: str = "matmul", binding: Any = None, packed: Any = ()) -> GemmStages:
    """C = A @ B (topi.cuda.matmul) with A and B read through `readers` (read_a((), i, k), read_b((), k, j):
    2-D operands have no batch index). The workload's sizes are constant: `binding` and `packed` are unused.

    >>> A, B = te.placeholder((64, 32), name="A"), te.placeholder((32, 48), name="B")
    >>> t = matmul_compute(CudaMatmulWorkload(64, 48, 32), None, None, (lambda b, i, k: A[i, k] * 2.0,
    ...                                                               lambda b, k, j: B[k, j]))
    >>> t.out.shape, [x.name for x in t.operands]
    ((64, 48), ['matmul.A', 'matmul.B'])
    """
    a, b = _operand_views(wl, readers, name)
    return GemmStages(cuda.matmul(a, b, name=name), (a, b))


def _operand_views(wl: "CudaMatmulWorkload | CudaGemvWorkload", readers: tuple[Callable, Callable],
                   name: str) -> tuple[te.Tensor, te.Tensor]:
    """A [m, k] and B [k, n] read through the graph's `readers` (2-D: no batch index), cast to the workload's
    dtype."""
    read_a, read_b = readers
    a = te.compute((wl.m, wl.k), lambda i, kk: read_a((), i, kk).astype(wl.dtype), name=f"{name}.A")
    b = te.compute((wl.k, wl.n), lambda kk, j: read_b((), kk, j).astype(wl.dtype), name=f"{name}.B")
    return a, b


def matmul_schedule(s: Schedule, t: GemmStages, wl: CudaMatmulWorkload, config: Config, target: CudaTarget,
                    epilogue: te.Tensor | None = None) -> None:
    """topi.cuda's SGEMM with `config` on the stages of `matmul_compute` inside the graph's schedule `s`, in
    float32 (a traced function's workloads do not allow TF32: numpy's numerics)."""
    _schedule_in_graph("cuda.matmul", cuda.schedule_matmul_stage, s, t, {**to_cfg(config), "tc": 0}, target,
                       epilogue)


def matmul_reads(wl: CudaMatmulWorkload, config: Config, target: CudaTarget) -> tuple[int, int]:
    """A is read once per column block of C, B once per row block."""
    cfg = to_cfg(config)
    return -(-wl.n // cfg["bn"]), -(-wl.m // cfg["bm"])


# ** cuda.gemv **

def _gemv_default_cfg(wl: CudaGemvWorkload, target: Any) -> dict[str, Any]:
    return cuda_gemv.default_gemv_config(wl.m, wl.n, wl.k, _check_target(wl.template, target))


def gemv_config_space(wl: CudaGemvWorkload, target: Any) -> ConfigSpace:
    """topi.cuda_gemv.gemv_space of the workload on `target`."""
    return cuda_gemv.gemv_space(wl.m, wl.n, wl.k, target, _gemv_default_cfg(wl, target))


def gemv_default(wl: CudaGemvWorkload, target: Any) -> Config:
    """topi.cuda_gemv.default_gemv_config as a point of the space."""
    cfg = _gemv_default_cfg(wl, target)
    return Config.of(block=(cfg["cols"], cfg["ks"]), lanes=cfg["lanes"], unroll=cfg["unroll"])


def gemv_build(wl: CudaGemvWorkload, config: Config, target: CudaTarget,
               prepacked: bool = False) -> tuple[Schedule, list[te.Tensor]]:
    """Placeholders A, B and the product C, scheduled with `config`: (Schedule, [A, B, C])."""
    A = te.placeholder((wl.m, wl.k), wl.dtype, name="A")
    B = te.placeholder((wl.k, wl.n), wl.dtype, name="B")
    C = cuda_gemv.gemv(A, B)
    return cuda_gemv.schedule_gemv(C, cuda_gemv.to_gemv_cfg(config), _check_target("cuda.gemv", target)), [A, B, C]


def gemv_compute(wl: CudaGemvWorkload, config: Config, target: CudaTarget, readers: tuple[Callable, Callable],
                 name: str = "gemv", binding: Any = None, packed: Any = ()) -> GemmStages:
    """C = A @ B (topi.cuda_gemv.gemv) with A and B read through `readers`, as `matmul_compute`."""
    a, b = _operand_views(wl, readers, name)
    return GemmStages(cuda_gemv.gemv(a, b, name=name), (a, b))


def gemv_schedule(s: Schedule, t: GemmStages, wl: CudaGemvWorkload, config: Config, target: CudaTarget,
                  epilogue: te.Tensor | None = None) -> None:
    """topi.cuda_gemv's schedule with `config` on the stages of `gemv_compute` inside the graph's schedule `s`:
    the operand views are computed where the reduction reads them."""
    _schedule_in_graph("cuda.gemv", cuda_gemv.schedule_gemv_stage, s, t, cuda_gemv.to_gemv_cfg(config), target,
                       epilogue)


def gemv_reads(wl: CudaGemvWorkload, config: Config, target: CudaTarget) -> tuple[int, int]:
    """A's row is computed once per block of columns (into shared memory: topi.cuda_gemv.stages_row), else once
    per column; each row's blocks read all of B."""
    cfg = cuda_gemv.to_gemv_cfg(config)
    staged = cuda_gemv.stages_row(wl.k, as_dtype(wl.dtype).itemsize, _check_target(wl.template, target))
    return (-(-wl.n // cfg["cols"]) if staged else wl.n), wl.m


# ** cuda.conv2d **

def conv2d_build(wl: CudaConv2dWorkload, config: Config, target: CudaTarget,
                 prepacked: bool = False) -> tuple[Schedule, list[te.Tensor]]:
    """Placeholders X, W and the convolution Y, scheduled with `config`: (Schedule, [X, W, Y])."""
    X = te.placeholder((wl.n, wl.c, wl.h, wl.w), wl.dtype, name="X")
    W = te.placeholder((wl.k, wl.c, wl.r, wl.s), wl.dtype, name="W")
    Y = cuda.conv2d_nchw(X, W, wl.stride, wl.padding, wl.dilation)
    return cuda.schedule_conv2d(Y, to_cfg(config), _check_target("cuda.conv2d", target)), [X, W, Y]


def conv2d_compute(wl: CudaConv2dWorkload, config: Config, target: CudaTarget, readers: tuple[Callable, Callable],
                   name: str = "conv2d", binding: Any = None, packed: Any = ()) -> GemmStages:
    """Y = conv2d_nchw(X, W) (topi.cuda's implicit GEMM) with X and W read through `readers` (read_x(n, c, h, w),
    read_w(k, c, r, s)). The workload's sizes are constant: `binding` and `packed` are unused.

    >>> X, W = te.placeholder((1, 4, 6, 6), name="X"), te.placeholder((8, 4, 3, 3), name="W")
    >>> wl = CudaConv2dWorkload(1, 4, 6, 6, 8, 3, 3, padding=(1, 1))
    >>> t = conv2d_compute(wl, None, None, (lambda *i: X[i] + 1.0, lambda *i: W[i]))
    >>> t.out.shape, [x.name for x in t.operands]
    ((1, 8, 6, 6), ['conv2d.X', 'conv2d.W'])
    """
    read_x, read_w = readers
    x = te.compute((wl.n, wl.c, wl.h, wl.w), lambda *i: read_x(*i).astype(wl.dtype), name=f"{name}.X")
    w = te.compute((wl.k, wl.c, wl.r, wl.s), lambda *i: read_w(*i).astype(wl.dtype), name=f"{name}.W")
    return GemmStages(cuda.conv2d_nchw(x, w, wl.stride, wl.padding, wl.dilation, name=name), (x, w))


def conv2d_schedule(s: Schedule, t: GemmStages, wl: CudaConv2dWorkload, config: Config, target: CudaTarget,
                    epilogue: te.Tensor | None = None) -> None:
    """topi.cuda's implicit GEMM with `config` on the stages of `conv2d_compute` inside the graph's schedule `s`."""
    _schedule_in_graph("cuda.conv2d", cuda.schedule_conv2d_stage, s, t, to_cfg(config), target, epilogue)


def conv2d_reads(wl: CudaConv2dWorkload, config: Config, target: CudaTarget) -> tuple[int, int]:
    """The filters are read once per column block of the GEMM, the input (im2col) once per row block and tap."""
    rows, cols, _ = wl.gemm
    cfg = to_cfg(config)
    return -(-rows // cfg["bm"]) * wl.r * wl.s, -(-cols // cfg["bn"])


# ** the tuned config of a workload (schedule_matmul / schedule_conv2d without a cfg) **

def tuned_cfg(template: str, workload: Any, target: CudaTarget) -> dict[str, int] | None:
    """The cfg `pick` chooses for `workload` on `target` when a source answers (records applied with
    jitop.apply_records, the cache's tuned / transferred / predicted configs of this very GPU Target); None
    when none does (the caller then uses the template's default).

    >>> from jitop.target import Target
    >>> tuned_cfg("cuda.matmul", CudaMatmulWorkload(64, 64, 64), Target.from_string("cuda -arch=sm_90")) is None
    True
    """
    choice = pick(Task(template, workload, target))
    return None if choice.source == "default" else to_cfg(choice.config)


MATMUL = registry.register(registry.Template("cuda.matmul", CudaMatmulWorkload, gemm_config_space, gemm_default,
                                             matmul_compute, matmul_schedule, matmul_build,
                                             matmul_reads, kind_fields=("dtype",)))
GEMV = registry.register(registry.Template("cuda.gemv", CudaGemvWorkload, gemv_config_space, gemv_default,
                                           gemv_compute, gemv_schedule, gemv_build, gemv_reads,
                                           kind_fields=("dtype",)))
CONV2D = registry.register(registry.Template("cuda.conv2d", CudaConv2dWorkload, gemm_config_space, gemm_default,
                                             conv2d_compute, conv2d_schedule, conv2d_build,
                                             conv2d_reads, kind_fields=("r", "s", "stride", "dilation", "dtype")))

__all__ = ["CudaMatmulWorkload", "CudaGemvWorkload", "CudaConv2dWorkload", "tuned_cfg", "MATMUL", "GEMV", "CONV2D"]
