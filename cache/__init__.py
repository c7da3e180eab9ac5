"""jitop.cache: see ../shared/DESIGN.md; filled in by later issues."""
