#!/usr/bin/env bash
# Build .whl/site.tar.xz, the packages benchmarks/gpu_check.sh unpacks on a GPU machine that cannot download
# anything (its image has Python 3.12 with numpy, torch, pytest and hypothesis, but another llvmlite and no
# diskcache or xgboost-cpu). Run it here, where a package index is reachable, then hand the folder over:
#
#   bash benchmarks/gpu_carry.sh                  # about 2 minutes: downloads, unpacks, compresses (~45 MB)
#   device run: command "bash benchmarks/gpu_check.sh", carry [".whl"]   (.whl/ is git-ignored)
#
# PY_VERSION (3.12) and PLATFORM pick the wheels; the versions are this checkout's llvmlite and the newest others.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py_version="${PY_VERSION:-3.12}"
llvmlite_version="$(python -c 'import llvmlite; print(llvmlite.__version__)')"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$py_version" --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d "$work/wheels" "llvmlite==$llvmlite_version" diskcache xgboost-cpu
mkdir -p "$work/site" "$repo/.whl"
for wheel in "$work"/wheels/*.whl; do
    python -m zipfile -e "$wheel" "$work/site/"
done
tar -cJf "$repo/.whl/site.tar.xz" -C "$work/site" .
ls -la "$repo/.whl/site.tar.xz"
ls "$work/wheels"
