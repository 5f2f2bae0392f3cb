#!/usr/bin/env bash
# GPU check: on a machine with a CUDA GPU, nvcc and torch or CuPy (Paddle not needed).
#   1. builds the CUDA kernels + the framework-free module (no Paddle library),
#   2. runs the op tests on the `kernels-cpu` and `cuda` backends against the same numpy
#      references (an unusable CUDA backend fails the run instead of skipping),
#   3. times each op on CUDA and prints one JSON report (also written to $OUT if set).
# Budget: well under 5 minutes.
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
set -e
tail -5 "$OUT_DIR/pytest.log"

"$PY" scripts/gpu_check_report.py --junit "$OUT_DIR/junit.xml" --build-seconds "$build_s" \
  --tests-rc "$tests_rc" --out "$OUT_DIR/gpu_check.json"
exit "$tests_rc"
