#!/usr/bin/env bash
# GPU check: on a machine with a CUDA GPU, nvcc and torch or CuPy (Paddle not needed).
#   1. builds the CUDA kernels + the framework-free module (no Paddle library),
#   2. runs the op tests on the `kernels-cpu` and `cuda` backends against the same numpy
#      references (an unusable CUDA backend fails the run instead of skipping),
#   3. runs the framework-free end-to-end greedy test on `cuda`
#      (tests/e2e/test_framework_free_greedy.py: the package's target step and MTP proposer
#      round, fastdeploy_mtp/runtime/spec_step.py, through the CUDA kernels on torch/CuPy
#      tensors, Paddle absent; the output must be plain greedy decoding and every step
#      identical to the CPU kernels'),
#   4. times each op on CUDA and prints one JSON report (also written to $OUT if set), with
#      the op tests under "tests" and the end-to-end test under "e2e".
# The exit status fails if the build, the op tests or the end-to-end test fail.
# Budget: well under 5 minutes (the end-to-end test takes seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-build/gpu_check}
mkdir -p "$OUT_DIR"
BUILD=build/gpu_check_cmake

t0=$(date +%s)
cmake -S . -B "$BUILD" -DPython3_EXECUTABLE="$(command -v "$PY")" -DFDMTP_WITH_PADDLE=OFF \
  -DFDMTP_WITH_CUDA=ON -DFDMTP_OUTPUT_DIR="$PWD/fastdeploy_mtp" > "$OUT_DIR/build.log" 2>&1 \
  || { tail -40 "$OUT_DIR/build.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" >> "$OUT_DIR/build.log" 2>&1 || { tail -40 "$OUT_DIR/build.log"; exit 1; }
build_s=$(( $(date +%s) - t0 ))

set +e
FDMTP_TEST_BACKENDS=kernels-cpu,cuda "$PY" -m pytest tests/ops -q -p no:cacheprovider \
  --junitxml="$OUT_DIR/junit.xml" > "$OUT_DIR/pytest.log" 2>&1
tests_rc=$?
FDMTP_TEST_BACKENDS=cuda "$PY" -m pytest tests/e2e/test_framework_free_greedy.py -q -p no:cacheprovider \
  --junitxml="$OUT_DIR/junit_e2e.xml" > "$OUT_DIR/pytest_e2e.log" 2>&1
e2e_rc=$?
set -e
tail -5 "$OUT_DIR/pytest.log"
tail -5 "$OUT_DIR/pytest_e2e.log"

"$PY" scripts/gpu_check_report.py --junit "$OUT_DIR/junit.xml" --build-seconds "$build_s" \
  --tests-rc "$tests_rc" --e2e-junit "$OUT_DIR/junit_e2e.xml" --e2e-rc "$e2e_rc" --out "$OUT_DIR/gpu_check.json"
if [ "$tests_rc" -ne 0 ] || [ "$e2e_rc" -ne 0 ]; then
  echo "gpu_check: FAILED (op tests rc=$tests_rc, end-to-end test rc=$e2e_rc)"
  exit 1
fi
