"""jitop.tuner: auto-tuning of operator templates (see ../shared/DESIGN.md).

space (knobs, Config) -> task (what a config is chosen for, `pick`) -> measure (build in worker processes,
run isolated) -> features + model (XGBoost rank model over lowered loops) -> search (random, grid, model-
guided) -> scheduler (one budget over a program's tasks) -> records (versioned JSON lines) -> apply_records.
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # the tuning API loads on first use: `import jitop` stays light for programs that never tune
    if name in ("tune", "extract_tasks", "WeightedTask"):
        from jitop.tuner import tuning
        return getattr(tuning, name)
    if name == "apply_records":
        from jitop.tuner.apply import apply_records
        return apply_records
    if name == "plot":
        from jitop.tuner.plotting import plot
        return plot
    raise AttributeError(f"module 'jitop.tuner' has no attribute {name!r}")
