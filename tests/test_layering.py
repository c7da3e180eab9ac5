"""Imports go one way (DESIGN.md): config/dtypes/errors <- te <- schedule <- tir <- codegen <- runtime;
`cache` imports nothing of the compiler. Every import statement counts, also those inside functions."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {"config": 0, "dtypes": 0, "errors": 0, "te": 1, "schedule": 2, "tir": 3, "codegen": 4, "runtime": 5}


def _imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return out


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 and parts[0] == "jitop" else None


CORE = sorted(p for p in (ROOT / "jitop").rglob("*.py") if p.relative_to(ROOT / "jitop").parts[0].removesuffix(".py") in LAYERS)


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(ROOT)))
def test_core_imports_only_lower_layers(path: pathlib.Path) -> None:
    own = LAYERS[path.relative_to(ROOT / "jitop").parts[0].removesuffix(".py")]
    bad = [m for m in _imports(path) if (_layer(m) or 0) > own]
    assert not bad, f"{path.relative_to(ROOT)} (layer {own}) imports higher layers: {bad}"


def test_cache_imports_nothing_of_the_compiler() -> None:
    for path in (ROOT / "cache").rglob("*.py"):
        bad = [m for m in _imports(path) if m.startswith("jitop") and not m.startswith("jitop.cache")]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_layer_check_catches_a_wrong_import(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from jitop.codegen.kernel import KernelCodegen\n")
    assert any((_layer(m) or 0) > LAYERS["te"] for m in _imports(bad))
