#!/usr/bin/env bash
# AddressSanitizer check of the native ops (CPU kernels, XPU3 kernels under the KP emulator,
# CUDA kernels under the CUDA emulator, the entries and the framework-free module): builds
# `_kernels` with -fsanitize=address (and UBSan's integer-overflow and bounds checks) into
# its own folder, then runs the op tests and the fuzz suite on the `kernels-cpu`, `xpu-emu`
# and `cuda-emu` backends against that build. (Here the emulated kernels are instrumented by
# ASan instead of the emulators' own access hooks: FDMTP_EMU_CHECK_ACCESSES=OFF.)
# Any out-of-bounds access, use-after-free or signed overflow aborts the run with a report.
#
#   bash scripts/asan_check.sh            (from the repository root; a few minutes on 2 cores)
#
# The Paddle library and CUDA are not built (the sanitizer runtime cannot be loaded into
# Paddle's process reliably, and there is no GPU to run CUDA on).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BUILD=${FDMTP_ASAN_BUILD_DIR:-build/asan}
PKG="$BUILD/pkg"
start=$(date +%s)

CMAKE=$("$PY" -c "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))" 2>/dev/null || command -v cmake)
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
echo "asan_check: building the framework-free module with $SAN"
"$CMAKE" -S . -B "$BUILD" -DPython3_EXECUTABLE="$(command -v "$PY")" -DFDMTP_WITH_PADDLE=OFF \
  -DFDMTP_WITH_CUDA=OFF -DFDMTP_EMU_CHECK_ACCESSES=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFDMTP_OUTPUT_DIR="$PWD/$BUILD/out" \
  -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" -DCMAKE_MODULE_LINKER_FLAGS="$SAN" > "$BUILD.log" 2>&1 \
  || { tail -30 "$BUILD.log"; exit 1; }
"$CMAKE" --build "$BUILD" -j "${FDMTP_BUILD_JOBS:-$(nproc)}" --target _kernels >> "$BUILD.log" 2>&1 \
  || { tail -30 "$BUILD.log"; exit 1; }

# A copy of the Python package whose _kernels is the sanitized build (the tests import
# fastdeploy_mtp from PYTHONPATH; the repository's own build stays untouched).
rm -rf "$PKG" && mkdir -p "$PKG"
cp -r fastdeploy_mtp "$PKG/"
find "$PKG" -name '*.so' -delete
cp "$BUILD"/out/_kernels*.so "$PKG/fastdeploy_mtp/"
cp "$BUILD/out/ops/_op_wrappers.py" "$PKG/fastdeploy_mtp/ops/"
# Paddle is kept out of this process (its own library trips the sanitizer at exit, and the
# Paddle binding is not part of this build): `import paddle` fails, so the tests of the
# Paddle binding skip through pytest.importorskip.
mkdir -p "$PKG/paddle"
echo 'raise ModuleNotFoundError("paddle is disabled in the sanitizer run (scripts/asan_check.sh)")' > "$PKG/paddle/__init__.py"

LIBASAN=$("${CXX:-c++}" -print-file-name=libasan.so)
LIBUBSAN=$("${CXX:-c++}" -print-file-name=libubsan.so)
echo "asan_check: running the op tests and the fuzz suite (kernels-cpu, xpu-emu, cuda-emu) under $LIBASAN"
# detect_leaks=0: CPython itself leaks at exit by design. The sanitizers abort on the first
# report, so a clean exit means no report.
# -P: the working directory is not put on sys.path, so `fastdeploy_mtp` is the sanitized copy.
# FDMTP_TEST_BACKENDS leaves out the `cpu` (Paddle) backend.
export FDMTP_SANITIZED=1 PYTHONPATH="$PWD/$PKG:$PWD" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:allocator_may_return_null=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 FDMTP_TEST_BACKENDS=kernels-cpu,xpu-emu,cuda-emu
LD_PRELOAD="$LIBASAN $LIBUBSAN" "$PY" -P -c "
import sys, fastdeploy_mtp._kernels as k
assert k.__file__.startswith('$PWD/$PKG'), k.__file__
assert 'paddle' not in sys.modules
print('asan_check: testing', k.__file__)"
# -n: in parallel (pytest-xdist); its workers take this process's sys.path, so they import
# the sanitized copy too.
LD_PRELOAD="$LIBASAN $LIBUBSAN" "$PY" -P -m pytest tests/ops tests/fuzz -q -p no:cacheprovider -o pythonpath= \
  -n "${FDMTP_ASAN_JOBS:-2}" --dist loadfile \
  --ignore=tests/ops/test_ipc.py --ignore=tests/ops/test_ipc_cuda.py --ignore=tests/ops/test_ipc_xpu.py \
  --ignore=tests/ops/test_build.py -x
echo "asan_check: clean in $(( $(date +%s) - start )) s"
