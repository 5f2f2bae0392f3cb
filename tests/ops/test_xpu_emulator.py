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


def test_local_memory_overflow_fails_the_launch_instead_of_corrupting_memory():
    with pytest.raises(ValueError, match=r"GM2LM: 128 bytes do not fit the 64-byte local buffer"):
        _kernels._xpu_emulator_selftest("local_overflow", 2, 4)


def test_core_returning_while_others_wait_at_sync_cluster_is_reported():
    # which side sees it first depends on the (seeded) core order: either message names it
    with pytest.raises(ValueError, match=r"(returned while|after 1 core\(s\) returned).*a deadlock on hardware"):
        _kernels._xpu_emulator_selftest("barrier_mismatch", 1, 4)


@pytest.mark.parametrize("clusters, cores", [(0, 4), (2, 0), (2, 65)])
def test_invalid_launch_shape_is_rejected(clusters, cores):
    d, s, e, f = _postprocess_inputs(4, 3, seed=0)
    with pytest.raises(ValueError, match=r"launch shape .* is invalid"):
        with _kernels.xpu_emulation(clusters, cores):
            _kernels.draft_model_postprocess(d, s, e, f)


def _postprocess_inputs(bsz, width, seed):
    rng = np.random.default_rng(seed)
    d = np.where(rng.random((bsz, width)) < 0.3, -1, rng.integers(0, 50, (bsz, width))).astype(np.int64)
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
    np.testing.assert_array_equal(s, want["base_model_seq_lens_this_time"], err_msg=f"<<<{clusters}, {cores}>>>")


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
    with pytest.raises(ValueError, match=r"batch size = 8193 exceeds the XPU3 kernel limit kMaxBatch = 8192"):
        with _kernels.xpu_emulation(2, 4):
            _kernels.eagle_gather_hidden_states(inp, cu, slt, slt, slt, slt, cu, n, out=out, output_token_num=n)


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
