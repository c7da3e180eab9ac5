"""The package list, found rather than written by hand (pyproject.toml holds everything else).

jitop/ installs as `jitop`; topi/, tuner/ and cache/ install as `jitop.topi`, `jitop.tuner` and
`jitop.cache` (pyproject's package-dir). setuptools' declarative `packages.find` cannot rename a
directory, so every package below each root is found here and named under its install name: a new
subpackage anywhere ships in wheels and editable installs without editing a list.
"""
from setuptools import find_packages, setup

ROOTS = {"jitop": "jitop", "jitop.topi": "topi", "jitop.tuner": "tuner", "jitop.cache": "cache"}

setup(packages=[f"{name}{sub}" for name, folder in ROOTS.items()
                for sub in ["", *(f".{p}" for p in find_packages(folder))]])
