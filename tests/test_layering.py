"""Imports go one way (DESIGN.md). Every import statement counts, also those inside functions, relative ones
(resolved against the importing module) and importlib.import_module / __import__ with a literal name.

Rules, on install names (jitop/X -> jitop.X, topi/X -> jitop.topi.X, tuner/X -> jitop.tuner.X,
cache/X -> jitop.cache.X):

- core: config, dtypes, errors, target (0) <- te (1) <- schedule (2) <- tir (3) <- codegen (4) <- runtime (5)
  <- driver (6, the lower/build API). A core module imports only core modules of its own or a lower layer:
  never jitop.graph, jitop.kernel, jitop.ops, jitop.cli, jitop.topi, jitop.tuner, jitop.cache, the jitop
  package itself or anything unknown. (So runtime never imports cache.)
- topi imports only te, schedule, dtypes, config, errors, target, tuner.space, tuner.registry, tuner.task, and
  tir.simplify (arithmetic on symbolic extents: output sizes, what a tile provably covers; TVM's topi uses its
  arith analyzer the same way)
  and itself: not tir, codegen, runtime, driver, graph, kernel, ops, cache.
- cache imports nothing of jitop outside jitop.cache.
- tuner and graph never import jitop.topi by name: they find templates through tuner.registry.
- every jitop import names a module that exists.
"""
from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# source folder -> the package it installs as (pyproject.toml's package-dir)
PACKAGE_DIRS = {"jitop": "jitop", "topi": "jitop.topi", "tuner": "jitop.tuner", "cache": "jitop.cache"}
CORE = {"config": 0, "dtypes": 0, "errors": 0, "target": 0, "te": 1, "schedule": 2, "tir": 3, "codegen": 4,
        "runtime": 5, "driver": 6}
TOPI_MAY_IMPORT = ("jitop.te", "jitop.schedule", "jitop.dtypes", "jitop.config", "jitop.errors", "jitop.target",
                   "jitop.tuner.space", "jitop.tuner.registry", "jitop.tuner.task", "jitop.topi",
                   "jitop.tir.simplify")


def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    """The install name of a source file: topi/conv2d.py -> jitop.topi.conv2d, jitop/te/__init__.py -> jitop.te."""
    rel = path.resolve().relative_to(root).with_suffix("").parts
    if rel[0] not in PACKAGE_DIRS:
        raise ValueError(f"{path} is not under one of {sorted(PACKAGE_DIRS)}")
    parts = [*PACKAGE_DIRS[rel[0]].split("."), *rel[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    return sorted(p for folder in PACKAGE_DIRS for p in (root / folder).rglob("*.py"))


def known_modules(root: pathlib.Path = ROOT) -> frozenset[str]:
    return frozenset(module_name(p, root) for p in source_files(root))


KNOWN = known_modules()


@dataclass(frozen=True)
class Import:
    line: int
    module: str        # absolute, and the submodule for `from package import submodule`


def imports(path: pathlib.Path, module: str, known: frozenset[str] = KNOWN) -> list[Import]:
    """Every module `path` (the source of `module`) imports, wherever the statement is."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(Import(node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                if node.level - 1 >= len(anchor):
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond the top-level package")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *filter(None, [base])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # `from jitop.tuner import registry` imports the submodule; `from jitop.te.expr import Expr`, the module
                out.append(Import(node.lineno, sub if sub in known else base))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in ("import_module", "__import__"):
                out.append(Import(node.lineno, node.args[0].value))
    return out


def _part(module: str) -> str | None:
    """The top-level part of jitop a module belongs to ('te', 'graph', 'topi', ...; '' for the jitop package)."""
    if module == "jitop":
        return ""
    return module.split(".")[1] if module.startswith("jitop.") else None


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(path: pathlib.Path, module: str | None = None, known: frozenset[str] = KNOWN) -> list[str]:
    """Every rule `path` breaks, one line each: 'rule: path:line imports X (why)'."""
    module = module or module_name(path)
    own = _part(module)
    found = []
    for imp in imports(path, module, known):
        target = imp.module
        part = _part(target)
        if part is None:
            continue  # not jitop
        where = f"{path.name}:{imp.line} ({module}) imports {target}"
        if target not in known:
            found.append(f"unknown-module: {where}, which is not a module of jitop/, topi/, tuner/ or cache/")
        if own in CORE:
            if part not in CORE or CORE[part] > CORE[own]:
                layer = f"layer {CORE[part]}" if part in CORE else "not a core layer"
                found.append(f"core-layers: {where} ({layer}); {own} is layer {CORE[own]} and may only import "
                             f"layers <= {CORE[own]} of config/dtypes/errors/target <- te <- schedule <- tir <- "
                             f"codegen <- runtime <- driver")
        if own == "topi" and not any(_under(target, p) for p in TOPI_MAY_IMPORT):
            found.append(f"topi-imports: {where}; templates may only import {', '.join(TOPI_MAY_IMPORT)}")
        if own == "cache" and not _under(target, "jitop.cache"):
            found.append(f"cache-imports-nothing: {where}; jitop.cache stores bytes and JSON and imports nothing "
                         f"of the compiler")
        if own in ("tuner", "graph") and _under(target, "jitop.topi"):
            found.append(f"{own}-not-topi: {where}; find templates through jitop.tuner.registry instead")
    return found


# ---------------------------------------------------------------------------------------------
# the tree
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", source_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_one_way(path: pathlib.Path) -> None:
    bad = violations(path)
    assert not bad, "\n".join(bad)


def test_every_part_of_jitop_is_checked() -> None:
    # a rule that matches no file checks nothing: the scan must see every package the rules name
    parts = {_part(m) for m in KNOWN}
    assert set(CORE) | {"", "graph", "kernel", "ops", "topi", "tuner", "cache"} <= parts, parts
    assert {"jitop.tuner.space", "jitop.cache.store", "jitop.runtime.parallel", "jitop.graph.to_te"} <= KNOWN


@pytest.mark.parametrize("rel, name", [
    ("jitop/__init__.py", "jitop"), ("jitop/te/__init__.py", "jitop.te"), ("jitop/tir/lower.py", "jitop.tir.lower"),
    ("topi/conv2d.py", "jitop.topi.conv2d"), ("topi/__init__.py", "jitop.topi"), ("tuner/space.py", "jitop.tuner.space"),
    ("cache/store.py", "jitop.cache.store"), ("topi/sub/x.py", "jitop.topi.sub.x")])
def test_install_names(rel: str, name: str) -> None:
    assert module_name(ROOT / rel) == name


# ---------------------------------------------------------------------------------------------
# the checker catches each kind of wrong import
# ---------------------------------------------------------------------------------------------

def _check(tmp_path: pathlib.Path, module: str, source: str, init: bool = False) -> list[str]:
    path = tmp_path / ("__init__.py" if init else "bad.py")
    path.write_text(source)
    return violations(path, module)


def _rules(found: list[str]) -> set[str]:
    return {line.split(":")[0] for line in found}


@pytest.mark.parametrize("module, source", [
    ("jitop.tir.bad", "def f():\n    from jitop.codegen.kernel import KernelCodegen\n"),       # inside a function
    ("jitop.tir.bad", "import jitop.codegen.kernel\n"),
    ("jitop.tir.bad", "from ..codegen import kernel\n"),                                        # relative
    ("jitop.tir.bad", "from .. import codegen\n"),
    ("jitop.te.bad", "from jitop.graph.ir import Node\n"),                                      # not a layer at all
    ("jitop.te.bad", "from jitop import kernel\n"),
    ("jitop.schedule.bad", "import jitop.ops\n"),
    ("jitop.codegen.bad", "from jitop.cli import main\n"),
    ("jitop.codegen.bad", "from jitop.driver import build\n"),                                  # driver is layer 6
    ("jitop.runtime.bad", "from jitop.driver import build\n"),
    ("jitop.runtime.bad", "from jitop.cache.store import DiskStore\n"),                         # runtime -> cache
    ("jitop.runtime.bad", "from jitop.cache import store\n"),
    ("jitop.runtime.bad", "from jitop.tuner.space import Config\n"),
    ("jitop.runtime.bad", "from jitop.topi import matmul\n"),
    ("jitop.driver", "from jitop.graph.compile import compile_graph\n"),
    ("jitop.config", "import jitop\n"),                                                          # the package itself
    ("jitop.target", "from jitop import Target\n"),
    ("jitop.errors", "from jitop.dtypes import DType\nfrom jitop.te import expr\n"),
    ("jitop.dtypes", "import importlib\nm = importlib.import_module('jitop.runtime.module')\n"),
])
def test_catches_core_importing_upward(tmp_path: pathlib.Path, module: str, source: str) -> None:
    assert "core-layers" in _rules(_check(tmp_path, module, source))


@pytest.mark.parametrize("source", [
    "from jitop.codegen.kernel import KernelCodegen\n", "from jitop.runtime.module import Module\n",
    "from jitop.graph.ir import Node\n", "from jitop.kernel import kernel\n", "from jitop.ops import matmul\n",
    "from jitop.cache.store import DiskStore\n", "from jitop.tir.lower import lower\n", "from jitop import driver\n",
    "from jitop import Target\n", "from jitop.tuner import measure_x\n", "from ..runtime import module\n",
    "def f():\n    import jitop.codegen.target\n"])
def test_catches_topi_importing_what_it_must_not(tmp_path: pathlib.Path, source: str) -> None:
    assert "topi-imports" in _rules(_check(tmp_path, "jitop.topi.bad", source))


def test_catches_cache_importing_the_compiler(tmp_path: pathlib.Path) -> None:
    for source in ("from jitop.dtypes import DType\n", "import jitop\n", "from .. import config\n",
                   "def f():\n    from jitop.target import Target\n", "from jitop.tuner.space import Config\n"):
        assert "cache-imports-nothing" in _rules(_check(tmp_path, "jitop.cache.bad", source)), source


@pytest.mark.parametrize("part", ["tuner", "graph"])
@pytest.mark.parametrize("source", [
    "from jitop import topi\n", "import jitop.topi.matmul\n", "from jitop.topi.conv2d import conv2d_nchw\n",
    "from ..topi import matmul\n", "def f():\n    from jitop.topi import conv2d\n",
    "import importlib\nimportlib.import_module('jitop.topi')\n", "__import__('jitop.topi.matmul')\n"])
def test_catches_tuner_and_graph_importing_topi(tmp_path: pathlib.Path, part: str, source: str) -> None:
    assert f"{part}-not-topi" in _rules(_check(tmp_path, f"jitop.{part}.bad", source))


def test_catches_unknown_modules(tmp_path: pathlib.Path) -> None:
    found = _check(tmp_path, "jitop.graph.bad", "from jitop.nonexistent import x\nimport jitop.graph.nothing_here\n")
    assert [line.split(":")[0] for line in found] == ["unknown-module", "unknown-module"]


def test_relative_imports_resolve_against_the_package(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "__init__.py"
    path.write_text("from . import matmul\nfrom .conv2d import x\nfrom .. import te\nfrom ..tuner import registry\n")
    assert [i.module for i in imports(path, "jitop.topi")] == [
        "jitop.topi.matmul", "jitop.topi.conv2d", "jitop.te", "jitop.tuner.registry"]
    path = tmp_path / "mod.py"
    path.write_text("from . import matmul\nfrom ..schedule.schedule import Schedule\n")
    assert [i.module for i in imports(path, "jitop.topi.mod")] == ["jitop.topi.matmul", "jitop.schedule.schedule"]


@pytest.mark.parametrize("module, source", [
    ("jitop.tir.good", "from jitop.te.expr import Expr\nfrom jitop import dtypes\nfrom jitop.tir import nodes\n"
                       "from ..schedule.schedule import Schedule\nimport numpy as np\n"),
    ("jitop.driver", "from jitop.runtime.module import Module\nfrom jitop.codegen.target import compile_ir\n"),
    ("jitop.config", "import os\n"),
    ("jitop.topi.good", "from jitop import te\nfrom jitop.tuner import registry\nfrom jitop.tuner.space import Config\n"
                        "from jitop.tuner.task import Task\nfrom jitop.topi import matmul\nfrom . import conv2d\n"
                        "from jitop.schedule.schedule import Schedule\nfrom jitop.target import Target\n"),
    ("jitop.cache.good", "from jitop.cache import store\nfrom . import store\nimport diskcache\n"),
    ("jitop.tuner.good", "from jitop.tuner import registry\nfrom jitop.cache import store\nfrom jitop import driver\n"),
    ("jitop.graph.good", "from jitop.tuner import registry\nfrom jitop.driver import compile_func\n"),
    ("jitop", "from jitop import topi\n"),
])
def test_allowed_imports_pass(tmp_path: pathlib.Path, module: str, source: str) -> None:
    assert _check(tmp_path, module, source) == []
