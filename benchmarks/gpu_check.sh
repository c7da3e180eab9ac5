#!/usr/bin/env bash
# One command for a GPU machine (NVIDIA H100/H200, CUDA driver, Python with numpy and torch; nothing can be
# downloaded there): the GPU tests, then the GPU benchmark, in under 8 minutes.
#
#   benchmarks/gpu_check.sh            # $OUT: where the logs and the report go (default /tmp/jitop-gpu-check)
#
# 1. .whl/site.tar.xz, if there, is unpacked into /tmp/site and put on PYTHONPATH (the llvmlite, diskcache and
#    xgboost-cpu this checkout needs, carried from a machine with an index: benchmarks/gpu_carry.sh builds it);
# 2. jitop runs from this tree: `pip install --no-deps --no-build-isolation --no-index -e .` maps jitop.topi /
#    jitop.tuner / jitop.cache onto topi/, tuner/, cache/ (pyproject's package-dir); if that fails, a plain
#    (non-editable) install is tried, and last a sitecustomize shim on PYTHONPATH that maps the three names
#    (no pip needed). Each is checked by importing jitop.topi.cuda from the tree;
# 3. versions and `nvidia-smi -L`;
# 4. pytest on tests/cuda, tests/topi/test_cuda_schedules.py and tests/onnx/test_onnx_gpu.py (log:
#    $OUT/gpu_tests.log, junit xml beside);
# 5. benchmarks/bench_gpu.py --out $OUT/bench_gpu.md (log: $OUT/bench_gpu.log), its SGEMM on TF32 tensor cores
#    (section c'') included;
# 6. benchmarks/bench_gpu_tune.py: jitop.tune on SGEMM 2048 for TUNE_BUDGET (60) s, default vs tuned GFLOP/s
#    (log: $OUT/gpu_tune.log), only while the whole run stays under 8 minutes;
# 7. benchmarks/bench_gpu_shapes.py --tokens 8: a decode loop with a growing key/value cache, symbolic shapes
#    against dynamic=False, and the host's cost of a small kernel's call (raw launch, jitop.build function,
#    traced constant and symbolic) (log: $OUT/gpu_shapes.log), likewise only while there is time (its status
#    is not the script's); then, time left, --long 300: a 300-token decode's device allocations, frees and host
#    time per token, weights on the GPU (appended to the same log).
# The benchmarks run even when tests fail; the exit status is the tests' (else the benchmark's, else the tuning's).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo" || exit 2
out="${OUT:-/tmp/jitop-gpu-check}"
mkdir -p "$out"
PY="${PYTHON:-$(command -v python || command -v python3)}"
TEST_TIMEOUT="${TEST_TIMEOUT:-200}"     # seconds for the tests
BENCH_TIMEOUT="${BENCH_TIMEOUT:-250}"   # seconds for the benchmark (its own budget is 60 s less)
TUNE_BUDGET="${TUNE_BUDGET:-60}"        # seconds of GPU tuning (step 6; its timeout is 50 s more)
start=$SECONDS

step() { printf '\n=== %s (%d s) ===\n' "$*" "$((SECONDS - start))"; }

# ** 1. carried packages **
site=""
if [ -f "$repo/.whl/site.tar.xz" ]; then
    step "unpacking .whl/site.tar.xz into /tmp/site"
    rm -rf /tmp/site && mkdir -p /tmp/site
    if tar -xJf "$repo/.whl/site.tar.xz" -C /tmp/site; then
        site=/tmp/site
        ls /tmp/site
    else
        echo "could not unpack .whl/site.tar.xz; going on with the installed packages"
    fi
fi
export PYTHONPATH="$repo${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

# ** 2. jitop importable from the tree (jitop.topi -> topi/ ...) **
importable() { (cd "$repo" && "$PY" -c "import jitop.topi.cuda, jitop.tuner, jitop.cache, jitop.runtime.cuda.driver") 2>&1; }
step "making jitop importable from $repo"
how=""
if err="$(importable)"; then
    how="already importable"
else
    if "$PY" -m pip --version >/dev/null 2>&1; then
        if "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --no-index \
                -e "$repo" && err="$(importable)"; then
            how="pip install -e (editable)"
        elif "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --no-index \
                "$repo" && err="$(importable)"; then
            how="pip install (a copy)"
        fi
    else
        echo "no pip here"
    fi
    if [ -z "$how" ]; then
        shim=/tmp/jitop-shim
        mkdir -p "$shim"
        cat > "$shim/sitecustomize.py" <<EOF
# jitop's package-dir mapping for a source tree (benchmarks/gpu_check.sh): jitop.topi -> topi/, ...
import importlib.util, sys
_MAP = {"jitop.topi": "$repo/topi", "jitop.tuner": "$repo/tuner", "jitop.cache": "$repo/cache"}
class _JitopTreeFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        folder = _MAP.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder + "/__init__.py",
                                                      submodule_search_locations=[folder])
sys.meta_path.append(_JitopTreeFinder)
EOF
        export PYTHONPATH="$shim:$PYTHONPATH"
        if err="$(importable)"; then how="sitecustomize shim ($shim)"; fi
    fi
fi
if [ -n "$how" ]; then
    echo "jitop importable: $how"
else
    echo "jitop is NOT importable from the tree; the tests and the benchmark will fail:"
    echo "$err" | tail -20
fi

# ** 3. versions **
step "versions"
"$PY" - <<'EOF'
import importlib, platform, sys
print("python", platform.python_version(), sys.executable)
for name in ("numpy", "llvmlite", "diskcache", "torch", "pytest", "xdist"):
    try:
        m = importlib.import_module(name)
        print(f"{name:10s} {getattr(m, '__version__', '?'):12s} {getattr(m, '__file__', '')}")
    except Exception as err:
        print(f"{name:10s} missing ({type(err).__name__}: {err})")
try:
    import jitop
    print("jitop from", jitop.__file__)
    from jitop.runtime.cuda import driver
    ok = driver.available()
    print("CUDA driver usable:", ok, "" if ok else driver.unavailable_reason())
    if ok:
        print("GPU:", driver.device_attributes())
except Exception as err:
    print("jitop / driver:", type(err).__name__, err)
EOF
nvidia-smi -L || echo "(nvidia-smi failed)"

# ** 4. tests **
step "GPU tests"
test_rc=0
if "$PY" -c "import pytest" 2>/dev/null; then
    # a module that cannot be imported there (a package missing) must not stop the others
    # (the emulated GPU's tests run the CPU emulator, not this GPU: CI runs them)
    args=(tests/cuda tests/topi/test_cuda_schedules.py tests/onnx/test_onnx_gpu.py -p no:cacheprovider -q
          --ignore=tests/cuda/test_emulated_gpu.py --ignore=tests/cuda/test_emulated_programs.py
          -o addopts='' -rfEs --maxfail=25 --continue-on-collection-errors --durations=10
          --junitxml "$out/gpu_tests.xml")
    # four processes share the GPU (each its own context): the tests are mostly compiling, and the suite took
    # about two minutes on two simulated-GPU workers here
    if "$PY" -c "import xdist" 2>/dev/null; then args+=(-n "${TEST_WORKERS:-4}" --dist loadfile); fi
    timeout -k 10 "$TEST_TIMEOUT" "$PY" -m pytest "${args[@]}" 2>&1 | tee "$out/gpu_tests.log"
    test_rc=${PIPESTATUS[0]}
    [ "$test_rc" = 124 ] && echo "the tests ran past ${TEST_TIMEOUT} s and were stopped" | tee -a "$out/gpu_tests.log"
else
    echo "pytest is not installed here: no tests ran (carry pytest, pluggy, iniconfig in .whl/site.tar.xz)" \
        | tee "$out/gpu_tests.log"
    test_rc=3
fi
echo "tests: exit $test_rc"

# ** 5. benchmark **
step "GPU benchmark"
timeout -k 10 "$BENCH_TIMEOUT" "$PY" benchmarks/bench_gpu.py --out "$out/bench_gpu.md" \
    --budget "$((BENCH_TIMEOUT - 60))" 2>&1 | tee "$out/bench_gpu.log"
bench_rc=${PIPESTATUS[0]}
echo "benchmark: exit $bench_rc"

# ** 6. tuning on the GPU **
tune_timeout=$((TUNE_BUDGET + 50))
if [ $((SECONDS - start + tune_timeout)) -le 480 ]; then
    step "GPU tuning: SGEMM 2048 for ${TUNE_BUDGET} s"
    timeout -k 10 "$tune_timeout" "$PY" benchmarks/bench_gpu_tune.py --size 2048 --budget "$TUNE_BUDGET" \
        --records "$out/gpu_tune.jsonl" 2>&1 | tee "$out/gpu_tune.log"
    tune_rc=${PIPESTATUS[0]}
else
    echo "GPU tuning skipped: $((SECONDS - start)) s spent, ${tune_timeout} s more would pass 8 minutes" \
        | tee "$out/gpu_tune.log"
    tune_rc=0
fi
echo "tuning: exit $tune_rc"

# ** 7. a decode loop with a growing cache: symbolic shapes on the GPU **
SHAPES_TIMEOUT="${SHAPES_TIMEOUT:-150}"
if [ $((SECONDS - start + SHAPES_TIMEOUT)) -le 480 ]; then
    step "decode loop on the GPU: symbolic shapes vs dynamic=False (8 tokens)"
    timeout -k 10 "$SHAPES_TIMEOUT" "$PY" benchmarks/bench_gpu_shapes.py --tokens 8 2>&1 | tee "$out/gpu_shapes.log"
    if [ $((SECONDS - start + 60)) -le 480 ]; then
        timeout -k 10 60 "$PY" benchmarks/bench_gpu_shapes.py --long 300 2>&1 | tee -a "$out/gpu_shapes.log"
    fi
else
    echo "decode loop skipped: $((SECONDS - start)) s spent, ${SHAPES_TIMEOUT} s more would pass 8 minutes" \
        | tee "$out/gpu_shapes.log"
fi

step "done: tests exit $test_rc, benchmark exit $bench_rc, tuning exit $tune_rc; files in $out"
ls -l "$out"
if [ "$test_rc" != 0 ]; then exit "$test_rc"; fi
if [ "$bench_rc" != 0 ]; then exit "$bench_rc"; fi
exit "$tune_rc"
