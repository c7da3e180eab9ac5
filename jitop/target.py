"""The machine code is built for: one frozen, hashable, JSON-serialisable description per compile.

A Target names the instruction set (LLVM triple, CPU name, feature string), the facts schedules are
derived from (vector width and registers, FMA units, caches, threads) and the build options that change
the code (optimisation level, the parallel-loop threshold). It is made once per compile and passed down;
nothing below the pipeline reads the host or the environment on its own, so `target.key` names all a
compiled kernel depends on.

>>> t = Target.from_string("llvm -mcpu=haswell")
>>> (t.cpu, t.vector_bytes, t.vector_registers, t.lanes(4))
('haswell', 32, 16, 8)
>>> Target.from_json(t.to_json()) == t
True
>>> "avx512f" in Target.from_string("llvm -mcpu=znver4").required_features
True
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shlex
from dataclasses import dataclass
from typing import Any

from jitop import config
from jitop.errors import TargetMismatchError

# x86-64 micro-architecture levels (the psABI's), in LLVM's feature names. A named CPU's feature string
# states every feature LLVM knows here, + or -, so its code can use only what `required_features` lists.
_BASE = frozenset("64bit cmov cx8 fxsr mmx sse sse2".split())
_V2 = _BASE | frozenset("cx16 sahf popcnt sse3 sse4.1 sse4.2 ssse3 crc32".split())
_V3 = _V2 | frozenset("avx avx2 bmi bmi2 f16c fma lzcnt movbe xsave".split())
_V4 = _V3 | frozenset("avx512f avx512bw avx512cd avx512dq avx512vl".split())
_INTEL = frozenset("aes pclmul rdrnd fsgsbase invpcid xsaveopt".split())
_ZEN = frozenset("adx sse4a clzero aes pclmul rdrnd rdseed fsgsbase xsaveopt sha".split())
_ICELAKE = _V4 | _INTEL | frozenset("adx rdseed avx512vnni avx512vbmi avx512vbmi2 avx512bitalg avx512vpopcntdq "
                                    "avx512ifma gfni vaes vpclmulqdq sha rdpid".split())

# feature -> features it needs (LLVM enables these with it, and disabling one disables its dependants)
_IMPLIES = {"sse3": {"sse2"}, "ssse3": {"sse3"}, "sse4.1": {"ssse3"}, "sse4.2": {"sse4.1"}, "avx": {"sse4.2"},
            "avx2": {"avx"}, "fma": {"avx"}, "f16c": {"avx"}, "avx512f": {"avx2", "fma", "f16c"},
            "vaes": {"aes", "avx"}, "vpclmulqdq": {"pclmul", "avx"}, "gfni": {"sse2"}, "aes": {"sse2"},
            "pclmul": {"sse2"}, "amx-int8": {"amx-tile"}, "amx-bf16": {"amx-tile"}, "avxvnni": {"avx2"}}

# CPU name -> (features it implies, FMA units per core, bytes per FMA unit); 0 units: unknown
KNOWN_CPUS: dict[str, tuple[frozenset[str], int, int]] = {
    "x86-64": (_BASE, 0, 16),
    "x86-64-v2": (_V2, 0, 16),
    "x86-64-v3": (_V3, 0, 32),
    "x86-64-v4": (_V4, 0, 64),
    "haswell": (_V3 | _INTEL, 2, 32),
    "broadwell": (_V3 | _INTEL | {"adx", "rdseed"}, 2, 32),
    "skylake": (_V3 | _INTEL | {"adx", "rdseed"}, 2, 32),
    "alderlake": (_V3 | _INTEL | {"adx", "rdseed", "avxvnni"}, 2, 32),
    "skylake-avx512": (_V4 | _INTEL | {"adx", "rdseed"}, 2, 64),
    "cascadelake": (_V4 | _INTEL | {"adx", "rdseed", "avx512vnni"}, 2, 64),
    "icelake-server": (_ICELAKE, 2, 64),
    "sapphirerapids": (_ICELAKE | frozenset("avx512bf16 avx512fp16 amx-tile amx-int8 amx-bf16".split()), 2, 64),
    "znver2": (_V3 | _ZEN, 2, 32),
    "znver3": (_V3 | _ZEN, 2, 32),
    "znver4": (_ICELAKE | _ZEN | {"avx512bf16"}, 2, 32),   # AVX-512 executed on 256-bit units
    "znver5": (_ICELAKE | _ZEN | {"avx512bf16"}, 2, 64),
}


@dataclass(frozen=True)
class Target:
    """What code is built for and what its schedules assume. Make one with `Target.current()` (the host,
    or JITOP_CPU), `Target.host()` (this machine) or `Target.from_string("llvm -mcpu=haswell")`.

    >>> Target.from_string("llvm -mcpu=haswell -mattr=+avx512f").vector_bytes
    64
    """

    triple: str
    cpu: str
    features: str                  # LLVM feature string, every feature explicit: "+avx2,+fma,-avx512f,..."

    vector_bytes: int              # 64 with AVX-512, 32 with AVX/AVX2, 16 otherwise
    vector_registers: int          # 32 with AVX-512 (zmm0-31), else 16
    fma_units: int = 0             # FMA pipes per core (0: unknown)
    fma_bytes: int = 0             # width of one FMA pipe
    l1d_bytes: int = 32 << 10
    l2_bytes: int = 1 << 20
    l3_bytes: int = 8 << 20
    threads: int = 1
    opt_level: int = 3             # build options: they change the code, so they are part of the key
    parallel_min_work: int = 1 << 15

    def __new__(cls, *args: Any, **kwargs: Any) -> "Target | CudaTarget":
        # Target("cuda") / Target("cuda -arch=sm_80"), as in TVM: a GPU target (not a Target, so no __init__)
        if len(args) == 1 and not kwargs and isinstance(args[0], str) and args[0].split()[:1] == ["cuda"]:
            return _cuda_from_string(args[0])
        return super().__new__(cls)

    # ** derived facts **
    def lanes(self, itemsize: int) -> int:
        """Elements of this size in one vector register."""
        return max(1, self.vector_bytes // itemsize)

    @property
    def required_features(self) -> frozenset[str]:
        """Features the code may use: a CPU without one of them must not run it."""
        return frozenset(f[1:] for f in self.features.split(",") if f.startswith("+"))

    @property
    def isa(self) -> str:
        """A short name for the vector instruction set: 'avx512', 'avx2', 'avx' or 'sse'."""
        req = self.required_features
        return next((name for name in ("avx512f", "avx2", "avx") if name in req), "sse").removesuffix("f")

    @functools.cached_property  # frozen fields: hashed once (part of every cache and task key)
    def key(self) -> str:
        """A stable string naming everything compiled code depends on (part of every cache key)."""
        digest = hashlib.sha256(self.to_json().encode()).hexdigest()[:16]
        return f"{self.cpu}-{self.isa}-t{self.threads}-{digest}"

    def describe(self) -> str:
        """One line for benchmark headers and `explain`."""
        fma = f", {self.fma_units}x{self.fma_bytes * 8}-bit FMA" if self.fma_units else ""
        return (f"{self.cpu} ({self.isa}, {self.vector_bytes * 8}-bit vectors x {self.vector_registers}{fma}), "
                f"L2 {self.l2_bytes >> 10} KiB, {self.threads} threads")

    # ** compatibility **
    def missing_on(self, host: "Target") -> list[str]:
        """Features this target's code needs that `host` lacks (empty: the host can run it)."""
        missing = sorted(self.required_features - host.required_features)
        if self.triple.split("-")[0] != host.triple.split("-")[0]:
            missing.insert(0, f"architecture {self.triple.split('-')[0]}")
        return missing

    def check_runs_on(self, host: "Target | None" = None, what: str = "this code") -> None:
        """Raise TargetMismatchError unless `host` (default: this machine) can execute code for this target."""
        host = host or Target.host()
        missing = self.missing_on(host)
        if missing:
            raise TargetMismatchError(
                f"{what} was built for {self.cpu} ({self.isa}) and needs {', '.join(missing)}, which this CPU "
                f"({host.cpu}) lacks; it was not run. Rebuild it here (or for a CPU this one covers, e.g. "
                f"JITOP_CPU=x86-64-v3 or jitop.build(..., target='llvm -mcpu=haswell')).")

    # ** construction **
    def replace(self, **changes: Any) -> "Target":
        """A copy with some fields changed, e.g. target.replace(threads=1)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        """Every field as canonical JSON (what `key` hashes and `from_json` reads)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str | dict) -> "Target":
        """A Target from `to_json`'s text (or its dict); a malformed description raises ValueError."""
        data = json.loads(text) if isinstance(text, str) else dict(text)
        names = {f.name for f in dataclasses.fields(Target)}
        unknown = set(data) - names
        if unknown or not {"triple", "cpu", "features"} <= set(data):
            raise ValueError(f"not a jitop Target description (unknown fields {sorted(unknown)}, "
                             f"needs triple, cpu, features)")
        for f in dataclasses.fields(Target):
            value = data.get(f.name, 0 if f.type == "int" else "")
            ok = isinstance(value, str) if f.type == "str" else type(value) is int and value >= 0
            if not ok:
                raise ValueError(f"not a jitop Target description: field {f.name}={value!r} must be "
                                 f"{'a string' if f.type == 'str' else 'a non-negative integer'}")
        return Target(**data)

    @staticmethod
    def host() -> "Target":
        """This machine as it is: its CPU name and features, caches, and the configured thread count."""
        cpu, features = _native_cpu()
        return _with_build_options(_make(_process_triple(), cpu, features))

    @staticmethod
    def current() -> "Target":
        """The default target of a compile: JITOP_CPU if set (a CPU name or a target string), else the host."""
        override = config.cpu_override()
        return Target.from_string(override) if override else Target.host()

    @staticmethod
    def from_string(text: str) -> "Target | CudaTarget":
        """Parse "llvm -mcpu=NAME -mattr=+a,-b" (or just "NAME"); -mcpu=native is this machine. "cuda" or
        "cuda -arch=sm_90" gives a CudaTarget.

        >>> Target.from_string("haswell").isa
        'avx2'
        """
        if text.split()[:1] == ["cuda"]:
            return _cuda_from_string(text)
        cpu, mattr = _parse(text)
        native, native_features = _native_cpu()
        if cpu in ("", "native", native):  # this machine, by any of its names
            cpu, base = native, {f[1:] for f in native_features.split(",") if f.startswith("+")}
        elif cpu in KNOWN_CPUS:
            base = set(KNOWN_CPUS[cpu][0])
        else:
            raise ValueError(f"target {text!r}: unknown CPU {cpu!r}; known: native ({native}), "
                             f"{', '.join(KNOWN_CPUS)}")
        return _with_build_options(_make(_process_triple(), cpu, _merge_features(base, mattr)))


CUDA_TRIPLE = "nvptx64-nvidia-cuda"
# the PTX ISA version LLVM writes for a GPU architecture (the lowest that has it; the CUDA 12+ drivers load it)
_PTX_FOR_ARCH = {"sm_70": "+ptx60", "sm_75": "+ptx63", "sm_80": "+ptx70", "sm_86": "+ptx71", "sm_89": "+ptx78",
                 "sm_90": "+ptx80", "sm_90a": "+ptx80", "sm_100": "+ptx86", "sm_120": "+ptx87"}


@dataclass(frozen=True)
class CudaTarget:
    """An NVIDIA GPU to build for: its architecture and the limits schedules respect. `jitop.cuda.target()` reads
    them from this machine's GPU; `Target.from_string("cuda -arch=sm_90")` (an H100's defaults) builds without one.

    >>> t = Target.from_string("cuda -arch=sm_80")
    >>> (t.arch, t.ptx_features, t.kind)
    ('sm_80', '+ptx70', 'cuda')
    >>> Target("cuda -arch=sm_80") == t
    True
    >>> CudaTarget.from_json(t.to_json()) == t
    True
    """

    arch: str = "sm_90"
    sm_count: int = 132
    max_threads_per_block: int = 1024
    shared_per_block: int = 48 << 10        # static shared memory of one block (more needs dynamic opt-in)
    shared_per_block_optin: int = 227 << 10
    registers_per_block: int = 65536
    warp_size: int = 32
    l2_bytes: int = 50 << 20
    opt_level: int = 3

    kind = "cuda"
    triple = CUDA_TRIPLE

    @property
    def ptx_features(self) -> str:
        """The LLVM feature string: the PTX ISA version to write (sm_90 needs PTX 8.0)."""
        return _PTX_FOR_ARCH.get(self.arch, "+ptx80")

    @functools.cached_property
    def key(self) -> str:
        """Everything compiled GPU code depends on, as one string (part of every GPU cache key)."""
        return f"cuda-{self.arch}-{hashlib.sha256(self.to_json().encode()).hexdigest()[:16]}"

    def holds_row(self, nbytes: int) -> bool:
        """Whether a block keeps a row of `nbytes` in shared memory (a few-row product's row of A): at most half
        of a block's, as more would cap the blocks an SM holds, and such a product needs many in flight.

        >>> CudaTarget().holds_row(3072 * 4), CudaTarget().holds_row(8192 * 4)
        (True, False)
        """
        return nbytes <= self.shared_per_block // 2

    def describe(self) -> str:
        """One line for benchmark headers and `explain`."""
        return (f"cuda {self.arch}: {self.sm_count} SMs, {self.max_threads_per_block} threads and "
                f"{self.shared_per_block >> 10} KiB shared memory per block, L2 {self.l2_bytes >> 20} MiB")

    def to_json(self) -> str:
        """Every field as canonical JSON."""
        return json.dumps({"kind": "cuda", **dataclasses.asdict(self)}, sort_keys=True)

    @staticmethod
    def from_json(text: str | dict) -> "CudaTarget":
        """A CudaTarget from `to_json`'s text; ValueError for anything else."""
        data = json.loads(text) if isinstance(text, str) else dict(text)
        if data.pop("kind", None) != "cuda":
            raise ValueError("not a jitop CUDA target description (kind must be 'cuda')")
        names = {f.name: f.type for f in dataclasses.fields(CudaTarget)}
        for k, v in data.items():
            if k not in names or (type(v) is not int if names[k] == "int" else not isinstance(v, str)):
                raise ValueError(f"not a jitop CUDA target description: field {k}={v!r}")
        return CudaTarget(**data)

    @staticmethod
    def from_attributes(attrs: dict) -> "CudaTarget":
        """The target of a GPU from its driver attributes (jitop.runtime.cuda.driver.device_attributes)."""
        return CudaTarget(arch=attrs["arch"], sm_count=attrs["sm_count"],
                          max_threads_per_block=attrs["max_threads_per_block"],
                          shared_per_block=min(attrs["shared_per_block"], 48 << 10),
                          shared_per_block_optin=attrs["shared_per_block_optin"],
                          registers_per_block=attrs["registers_per_block"], warp_size=attrs["warp_size"],
                          l2_bytes=attrs["l2_bytes"], opt_level=config.opt_level())

    def check_runs_on(self, device_arch: str, what: str = "this code") -> None:
        """TargetMismatchError unless code built for this target runs on a GPU of `device_arch`."""
        if device_arch.rstrip("a") != self.arch.rstrip("a"):
            raise TargetMismatchError(f"{what} was built for {self.arch}, but this GPU is {device_arch}; it was "
                                      f"not loaded. Rebuild it for this GPU (target='cuda').")


def _cuda_from_string(text: str) -> CudaTarget:
    arch = "sm_90"
    for w in shlex.split(text.strip())[1:]:
        if w.startswith("-arch="):
            arch = w.split("=", 1)[1]
        else:
            raise ValueError(f"target {text!r}: unknown option {w!r}; expected 'cuda' or 'cuda -arch=sm_90'")
    if not arch.startswith("sm_") or not arch[3:].rstrip("a").isdigit():
        raise ValueError(f"target {text!r}: -arch must name a compute capability such as sm_80 or sm_90")
    return CudaTarget(arch=arch, opt_level=config.opt_level())


def _parse(text: str) -> tuple[str, str]:
    words = shlex.split(text.strip())
    if words and words[0] == "llvm":
        words = words[1:]
    cpu, mattr = "", ""
    for w in words:
        if w.startswith("-mcpu="):
            cpu = w.split("=", 1)[1]
        elif w.startswith("-mattr="):
            mattr = w.split("=", 1)[1]
        elif w.startswith("-") or cpu:
            raise ValueError(f"target {text!r}: unknown option {w!r}; expected 'llvm -mcpu=NAME -mattr=+a,-b'")
        else:
            cpu = w
    for f in filter(None, mattr.split(",")):
        if f[0] not in "+-":
            raise ValueError(f"target {text!r}: -mattr entry {f!r} must start with + or -")
    return cpu, mattr


def _merge_features(base: set[str], mattr: str) -> str:
    """The feature string of `base` with mattr's +/- entries applied, closed under LLVM's implications
    (+avx2 brings avx; -avx takes avx2, fma and AVX-512 with it): every known feature stated, sorted."""
    entries = [f for f in mattr.split(",") if f]
    on = _with_needs(set(base) | {f[1:] for f in entries if f[0] == "+"})
    for off in (f[1:] for f in entries if f[0] == "-"):
        on -= {f for f in on if off in _with_needs({f})}
    universe = set(_native_features()) | on | {f[1:] for f in entries}
    return ",".join(f"{'+' if name in on else '-'}{name}" for name in sorted(universe))


def _needs(feature: str) -> set[str]:
    if feature.startswith("avx512") and feature != "avx512f":
        return {"avx512f"}
    return _IMPLIES.get(feature, set())


def _with_needs(features: set[str]) -> set[str]:
    """`features` and everything they need, transitively."""
    out, todo = set(), list(features)
    while todo:
        f = todo.pop()
        if f not in out:
            out.add(f)
            todo.extend(_needs(f))
    return out


def _make(triple: str, cpu: str, features: str) -> Target:
    on = {f[1:] for f in features.split(",") if f.startswith("+")}
    wide = "avx512f" in on
    vector_bytes = 64 if wide else 32 if "avx" in on else 16
    _, units, unit_bytes = KNOWN_CPUS.get(cpu, (None, 0, 0))
    l1, l2, l3 = _host_caches()
    return Target(triple=triple, cpu=cpu, features=features, vector_bytes=vector_bytes,
                  vector_registers=32 if wide else 16, fma_units=units, fma_bytes=min(unit_bytes, vector_bytes),
                  l1d_bytes=l1, l2_bytes=l2, l3_bytes=l3)


def _with_build_options(t: Target) -> Target:
    # the caches and thread count are the machine's whatever ISA is chosen: it runs here
    return t.replace(threads=config.num_threads(), opt_level=config.opt_level(),
                     parallel_min_work=config.parallel_min_work())


@functools.cache
def init_llvm():
    """llvmlite's binding, with LLVM's native target initialised (once per process)."""
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()
    return llvm


@functools.cache
def _process_triple() -> str:
    return init_llvm().get_process_triple()


@functools.cache
def _native_features() -> dict[str, bool]:
    return dict(init_llvm().get_host_cpu_features())


@functools.cache
def _native_cpu() -> tuple[str, str]:
    features = _native_features()
    return init_llvm().get_host_cpu_name(), ",".join(f"{'+' if on else '-'}{name}" for name, on in sorted(features.items()))


@functools.cache
def _host_caches() -> tuple[int, int, int]:
    return _cache_bytes(1, 32 << 10), _cache_bytes(2, 1 << 20), _cache_bytes(3, 8 << 20)


def _cache_bytes(level: int, default: int) -> int:
    """Size of this CPU's level-`level` data cache (per core for L1/L2) from sysfs; `default` elsewhere."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            path = os.path.join(base, entry)
            with open(os.path.join(path, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default
