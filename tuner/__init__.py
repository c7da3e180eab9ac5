"""jitop.tuner: see ../shared/DESIGN.md; filled in by later issues."""
