"""Every docstring example of jitop runs and gives the output it shows (examples marked
`# doctest: +SKIP` are exempt). Modules are found by walking the packages: jitop and the folders installed
inside it (topi/ -> jitop.topi, tuner/ -> jitop.tuner, cache/ -> jitop.cache), so a new module is covered
without being listed. The examples may assume `np`, `jitop` and `te`."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import numpy as np
import pytest

import jitop
from jitop import te

ROOTS = ("jitop", "jitop.topi", "jitop.tuner", "jitop.cache")
SKIP_MODULES = {"jitop.__main__"}   # importing it runs the command line


def _modules() -> list[str]:
    names = set()
    for root in ROOTS:
        package = importlib.import_module(root)
        names.add(root)

        def fail(name: str) -> None:
            raise ImportError(f"could not import {name} while looking for doctests")

        names.update(m.name for m in pkgutil.walk_packages(package.__path__, f"{root}.", onerror=fail))
    return sorted(names - SKIP_MODULES)


MODULES = _modules()


def test_walk_finds_the_public_api() -> None:
    assert {"jitop", "jitop.target", "jitop.kernel", "jitop.driver", "jitop.te.tensor", "jitop.schedule.schedule",
            "jitop.tuner.space", "jitop.cache.store"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    globs = {**vars(module), "np": np, "jitop": jitop, "te": te}
    for test in finder.find(module, name, globs=globs):
        # a test found in an object imported from elsewhere belongs to that module's run
        runner.run(test, out=report.append)
    failed, attempted = runner.failures, runner.tries
    assert failed == 0, f"{failed} of {attempted} docstring examples of {name} failed:\n" + "".join(report)
