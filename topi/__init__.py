"""Operator templates (jitop.topi): each module registers its template with jitop.tuner.registry on import."""
from jitop.topi import conv2d, cuda_templates, matmul  # noqa: F401 - imported to register the templates
