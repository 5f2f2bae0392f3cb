"""The XPU3 backend's own checks: the KP emulator reports rule violations instead of
corrupting memory, the wrappers enforce the named capacity limits of xpu_limits.h, results
do not depend on the launch shape, and FDMTP_WITH_XPU=ON without the Kunlun SDK fails at
configure time naming the variable. (Every op test also runs on the `xpu-emu` backend.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from tests.reference.draft_model_postprocess import draft_model_postprocess as ref_postprocess

_kernels = pytest.importorskip("fastdeploy_mtp._kernels")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(
    not _kernels.build_info().get("xpu_emulator", False), reason="built with the real XPU toolchain"
)


@pytest.mark.parametrize("clusters, cores", [(0, 4), (2, 0), (2, 65)])
def test_invalid_launch_shape_is_rejected(clusters, cores):
    d, s, e, f = _postprocess_inputs(4, 3, seed=0)
    with pytest.raises(ValueError, match=r"launch shape .* is invalid"):
        with _kernels.xpu_emulation(clusters, cores):
            _kernels.draft_model_postprocess(d, s, e, f)


def _postprocess_inputs(bsz, width, seed):
    rng = np.random.default_rng(seed)
    d = np.where(rng.random((bsz, width)) < 0.3, -1, rng.integers(0, 50, (bsz, width))).astype(
        np.int64
    )
    s = rng.integers(0, width + 1, bsz).astype(np.int32)
    e = np.where(rng.random(bsz) < 0.2, 5, 0).astype(np.int32)
    f = rng.random((bsz, 1)) < 0.2
    return d, s, e, f


@pytest.mark.parametrize("clusters, cores", [(1, 1), (1, 64), (12, 64), (5, 3)])
def test_results_do_not_depend_on_the_launch_shape(clusters, cores):
    d, s, e, f = _postprocess_inputs(1500, 6, seed=1)
    want = ref_postprocess(d.copy(), s.copy(), e.copy(), f.copy())
    with _kernels.xpu_emulation(clusters, cores):
        _kernels.draft_model_postprocess(d, s, e, f)
    np.testing.assert_array_equal(
        s, want["base_model_seq_lens_this_time"], err_msg=f"<<<{clusters}, {cores}>>>"
    )


def test_draft_width_beyond_kmaxdraftwidth_is_rejected_before_any_write():
    d, s, e, f = _postprocess_inputs(3, 129, seed=2)
    before = s.copy()
    with pytest.raises(
        ValueError,
        match=r"draft_model_postprocess: .*width \(K \+ 1\) = 129 "
        r"exceeds the XPU3 kernel limit kMaxDraftWidth = 128",
    ):
        with _kernels.xpu_emulation(2, 4):
            _kernels.draft_model_postprocess(d, s, e, f)
    np.testing.assert_array_equal(s, before)


def test_batch_beyond_kmaxbatch_is_rejected_by_the_prefix_sum_kernels():
    bsz = 8193  # kMaxBatch + 1: the per-item offsets no longer fit in shared memory
    inp = np.zeros((4, 2), np.float32)
    slt = np.zeros(bsz, np.int32)
    out = np.zeros((bsz, 2), np.float32)
    n = np.zeros(1, np.int32)
    cu = np.zeros(bsz + 1, np.int32)
    with pytest.raises(
        ValueError, match=r"batch size = 8193 exceeds the XPU3 kernel limit kMaxBatch = 8192"
    ):
        with _kernels.xpu_emulation(2, 4):
            _kernels.eagle_gather_hidden_states(
                inp, cu, slt, slt, slt, slt, cu, n, out=out, output_token_num=n
            )


def test_emulation_scope_ends_with_the_with_block():
    d, s, e, f = _postprocess_inputs(3, 129, seed=3)
    with pytest.raises(ValueError):
        with _kernels.xpu_emulation(1, 2):
            _kernels.draft_model_postprocess(d, s, e, f)
    _kernels.draft_model_postprocess(d, s, e, f)  # the CPU kernel has no width limit


def _cmake():
    here = os.path.join(os.path.dirname(sys.executable), "cmake")
    return here if os.path.exists(here) else shutil.which("cmake")


@pytest.mark.skipif(_cmake() is None, reason="cmake is not installed")
def test_with_xpu_and_no_sdk_fails_at_configure_naming_the_variable():
    env = {k: v for k, v in os.environ.items() if k not in ("CLANG_PATH", "XRE_PATH", "XDNN_PATH")}
    with tempfile.TemporaryDirectory() as build:
        proc = subprocess.run(
            [
                _cmake(),
                "-S",
                ROOT,
                "-B",
                build,
                "-DFDMTP_WITH_XPU=ON",
                "-DFDMTP_WITH_CUDA=OFF",
                "-DFDMTP_WITH_PADDLE=OFF",
                f"-DPython3_EXECUTABLE={sys.executable}",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert proc.returncode != 0
    message = " ".join((proc.stdout + proc.stderr).split())
    assert "set CLANG_PATH" in message and "-DCLANG_PATH=/opt/kunlun/xtdk" in message, message
    assert "-DFDMTP_XPU_SDK=/opt/kunlun" in message, message


# ---- Run-time checks of the scheduler and the access hooks ----------------------------------


def _access_selftest(which, clusters, cores):
    """Runs an emulator self-test; one that needs the access instrumentation skips in builds
    without it (scripts/asan_check.sh), which the wrapper reports by name."""
    try:
        _kernels._xpu_emulator_selftest(which, clusters, cores)
    except ValueError as e:
        if "FDMTP_EMU_CHECK_ACCESSES=OFF" in str(e):
            pytest.skip(str(e))
        raise


# Emulator self-tests whose launch must fail with a message naming what went wrong instead of
# corrupting memory or hanging: self-test -> (clusters, cores, message pattern).
FAILING_SELFTESTS = {
    # a local-memory copy larger than the local buffer
    "local_overflow": (2, 4, r"GM2LM: 128 bytes do not fit the 64-byte local buffer"),
    # a core returning while the others wait at sync_cluster; which side sees it first
    # depends on the (seeded) core order: either message names it
    "barrier_mismatch": (
        1,
        4,
        r"(returned while|after 1 core\(s\) returned).*a deadlock on hardware",
    ),
    # a shared-memory write reaching sync_cluster without mfence
    "missing_mfence": (
        2,
        4,
        r"core \d+ of cluster \d+ wrote shared memory and reached sync_cluster\(\) ",
    ),
    # reading another core's local memory
    "foreign_local": (2, 3, r"core 1 of cluster \d+ read the local memory of another core"),
    # a stack beyond local memory
    "stack_overflow": (1, 2, r"used \d+ bytes of stack, more than local memory \(8192 bytes"),
    # an unknown self-test is rejected by name
    "nope": (1, 1, r"unknown self-test 'nope'"),
}


@pytest.mark.parametrize("selftest", list(FAILING_SELFTESTS))
def test_violation_fails_the_launch_naming_it(selftest):
    clusters, cores, pattern = FAILING_SELFTESTS[selftest]
    with pytest.raises(ValueError, match=pattern):
        _access_selftest(selftest, clusters, cores)


# ---- Compile-time enforcement of the XTDK dialect ---------------------------------------------
# Each snippet is checked as the emulated build checks a kernel source: the dialect lint,
# then g++ -fsyntax-only with the emulated .xpu units' defines and include folders.

_LINT = os.path.join(ROOT, "custom_ops", "xpu", "emu", "xtdk_lint.py")
_PRELUDE = '#include "xpu/kernel/kp.h"\nnamespace fdmtp_xpu3 {\n'
_CONFORMING = """
struct Twice {
  __device__ int64_t operator()(int64_t v) const { return 2 * v; }
};
__device__ inline int64_t First(__global_ptr__ const int64_t* p) { return p[0]; }
__global__ void snippet(fdmtp::DraftModelPostprocessArgs args, __global_ptr__ int64_t* out) {
  __local__ int64_t v = Twice()(args.bsz) + First(args.draft_tokens);
  LM2GM(&v, out, sizeof(v));
  mfence();
}
}  // namespace fdmtp_xpu3
"""


def _snippet(body: str) -> str:
    """A kernel unit with `body` inside the conforming kernel (before its store)."""
    return _PRELUDE + _CONFORMING.replace("  LM2GM(&v, out", body + "\n  LM2GM(&v, out")


@pytest.fixture(scope="module")
def generated_include():
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                sys.executable,
                os.path.join(ROOT, "custom_ops", "codegen", "op_codegen.py"),
                "--repo",
                ROOT,
            ]
            + ["--out", out],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield os.path.join(out, "include")


def _check_kernel_source(source: str, generated: str) -> tuple[bool, str]:
    """(accepted, diagnostics) of kernel source `source` (kernel `snippet`) as the emulated
    build checks it: the lint on the source, then g++ on a unit that includes it and adds the
    kernel's emulator entry (as the generated xpu_emu/<op>.cc do)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snippet.xpu")
        with open(path, "w") as f:
            f.write(source)
        unit = os.path.join(tmp, "unit.cc")
        with open(unit, "w") as f:
            f.write('#include "snippet.xpu"\nFDMTP_XPU_EMU_ENTRY(snippet)\n')
        lint = subprocess.run(
            [sys.executable, _LINT, path], capture_output=True, text=True, timeout=60
        )
        if lint.returncode != 0:
            return False, lint.stdout + lint.stderr
        cxx = os.environ.get("CXX") or shutil.which("g++") or "c++"
        flags = ["-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror"]
        defines = ["-DFDMTP_XPU_EMULATOR", "-DFDMTP_XPU_DEVICE_CODE", "-Dfdmtp=fdmtp_xpuemu"]
        includes = [
            "-I" + os.path.join(ROOT, "custom_ops"),
            "-I" + os.path.join(ROOT, "custom_ops", "include"),
        ]
        gxx = subprocess.run(
            [cxx, *flags, *defines, *includes, "-I" + generated, unit],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return gxx.returncode == 0, gxx.stdout + gxx.stderr


def test_conforming_kernel_compiles_in_emulator_mode(generated_include):
    ok, message = _check_kernel_source(_PRELUDE + _CONFORMING, generated_include)
    assert ok, message


@pytest.mark.parametrize(
    "body, rule",
    [
        ("  auto g = [&](int64_t b) { return b + v; };\n  v = g(1);", "no-lambda"),
        ("  v = std::max<int64_t>(v, 1);", "no-std"),
        ("  memset(&v, 0, sizeof(v));", "no-std"),
        (
            "  int64_t (*add)(int64_t, int64_t) = fdmtp::SatAdd;\n  v = add(v, 1);",
            "no-function-pointer",
        ),
        ("  v = fdmtp::NgramFindNextScalar != nullptr ? 1 : 0;", "no-function-pointer"),
    ],
    ids=[
        "lambda",
        "std-call",
        "c-library-call",
        "function-pointer-type",
        "device-function-as-value",
    ],
)
def test_lint_rejects_what_types_cannot(body, rule, generated_include):
    ok, message = _check_kernel_source(_snippet(body), generated_include)
    assert not ok
    assert "snippet.xpu:" in message and f": {rule}: " in message, message


@pytest.mark.parametrize(
    "body",
    [
        # an unqualified (local-memory) pointer holding a global-memory address
        "  const int64_t* row = args.draft_tokens;\n  v += row[0];",
        # a global-memory pointer passed to an unqualified parameter
        "  v += fdmtp::DraftModelPostprocessCount<const int64_t*>(args.draft_tokens, args.width);",
    ],
    ids=["unqualified-pointer", "unqualified-parameter"],
)
def test_dropping_the_global_pointer_qualifier_does_not_compile(body, generated_include):
    ok, message = _check_kernel_source(_snippet(body), generated_include)
    assert not ok
    # __global_ptr__ is `volatile` in the emulator: g++ names the dropped qualifier
    assert "volatile" in message and (
        "discards qualifiers" in message or "invalid conversion" in message
    ), message


def test_kernel_taking_a_struct_with_an_unqualified_pointer_does_not_compile(generated_include):
    source = _PRELUDE + (
        "struct Bad {\n  const int64_t* p;\n  int64_t n;\n};\n"
        "__global__ void snippet(Bad b) { (void)b; }\n"
        "}  // namespace fdmtp_xpu3\n"
    )
    ok, message = _check_kernel_source(source, generated_include)
    assert not ok
    assert "dialect rule gm-pointer" in message, message
