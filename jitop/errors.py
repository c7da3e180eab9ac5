"""jitop's exceptions; long messages are built here so call sites stay short."""
from __future__ import annotations


class JitopError(Exception):
    """Base class of jitop's own errors."""


class ScheduleError(JitopError, ValueError):
    """A schedule primitive was applied in a way that cannot work."""


class TargetMismatchError(JitopError, RuntimeError):
    """Native code was built for a CPU whose features this machine lacks; it is never executed."""


class LoweringError(JitopError, ValueError):
    """A schedule could not be lowered to loops."""


class Unsupported(JitopError):
    """A construct jitop cannot trace; `construct` names it for the fallback warning."""

    def __init__(self, construct: str, hint: str = ""):
        super().__init__(construct + (f"; {hint}" if hint else ""))
        self.construct = construct


class ScalarNeeded(Unsupported):
    """A Python scalar argument, traced as a run-time value, was used where its value is needed while tracing
    (a size, an index, int()): `leaves` are the argument leaves it came from, which the kernel can make static."""

    def __init__(self, construct: str, hint: str, leaves: tuple[int, ...]):
        super().__init__(construct, hint)
        self.leaves = leaves


class TracerConversionError(JitopError, TypeError):
    """A traced array was used where a concrete value is needed."""


class FallbackError(JitopError, NotImplementedError):
    """Raised instead of falling back to numpy when the kernel was declared with fallback=False."""


class JitopFallbackWarning(UserWarning):
    """A decorated function (or one signature of it) runs as plain numpy."""


class JitopRecompileWarning(UserWarning):
    """A decorated function keeps compiling a kernel per shape although its dims vary (a size is used as a
    Python int, or its symbolic trace failed): the warning names the line or the reason."""


class TemplateNotFoundError(JitopError, LookupError):
    """No operator template is registered under a name."""


def axis_already_transformed(stage: str, axis: str, how: str, into: list[str]) -> ScheduleError:
    where = ", ".join(into)
    return ScheduleError(
        f"stage '{stage}': axis '{axis}' was already {how} into ({where}); it is no longer a loop of the stage. "
        f"Apply the primitive to one of ({where}) instead.")


def axis_not_in_stage(stage: str, axis: str, leaves: list[str]) -> ScheduleError:
    return ScheduleError(
        f"stage '{stage}' has no loop '{axis}'; its loops are currently ({', '.join(leaves)}). "
        f"Use an axis of this stage (s[T].op.axis, s[T].op.reduce_axis, or what split/fuse returned).")


class UnsupportedOperatorError(JitopError, NotImplementedError):
    """A model uses operators jitop does not implement: `ops` maps each op type to (count, first node names)."""

    def __init__(self, ops: dict[str, tuple[int, list[str]]], opset: int | None = None):
        self.ops = ops
        listed = "; ".join(f"{op} x{count} (first: {', '.join(repr(n) for n in names)})"
                           for op, (count, names) in sorted(ops.items()))
        at = f" (opset {opset})" if opset is not None else ""
        super().__init__(f"the model{at} uses {len(ops)} operator type(s) jitop does not support: {listed}. "
                         "Supported: jitop.onnx.supported_ops()")
