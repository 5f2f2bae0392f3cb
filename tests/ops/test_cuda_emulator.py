"""The CUDA emulator's own checks (the `cuda-emu` backend: every op test also runs there,
`FDMTP_TEST_BACKENDS=cuda-emu python -m pytest tests/ops`): kernels with injected bugs make
their launch fail with a report that names the bug, correct kernels give the right answer,
ops really run their CUDA kernels inside `emulate("cuda")` (Paddle) and
`_kernels.cuda_emulation` (framework-free), and the engine generates the same tokens with
its ops emulated."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.reference.draft_model_postprocess import draft_model_postprocess as ref_postprocess
from tests.support.op_states import postprocess_state as make_state

_kernels = pytest.importorskip("fastdeploy_mtp._kernels")

needs_checks = pytest.mark.skipif(
    not _kernels.build_info().get("emulator_access_checks", False),
    reason="this build leaves the emulators' access instrumentation out "
    "(the AddressSanitizer build)",
)

# (kernel, the report it must produce)
INJECTED_BUGS = [
    ("missing_syncthreads", r"shared-memory race: thread \(1, 0, 0\) .* reads shared memory .* "
     r"which thread \(0, 0, 0\) wrote with no __syncthreads\(\) between"),
    ("off_by_one", r"writes 8 byte\(s\) at 0x[0-9a-f]+, outside every tensor of the launch "
     r"\(out of bounds\)"),
    ("wrong_shuffle_mask", r"thread \(16, 0, 0\) .* \(lane 16\) calls __shfl_up_sync with mask "
     r"0x0000ffff, which omits it"),
    ("divergent_barrier", r"32 thread\(s\) wait at __syncthreads\(\) which 32 thread\(s\) of the "
     r"block never reach"),
    ("uninitialised_shared", r"reads shared memory .* that no thread of the block has written"),
    ("atomic_race", r"shared-memory race: .* reads shared memory .* which an atomic wrote"),
    ("invalid_shape", r"<<<\(1, 1, 1\), \(2048, 1, 1\)>>>: invalid launch shape"),
    ("dynamic_shared_without_opt_in", r"65536 bytes of dynamic shared memory exceed the 49152 "
     r"this kernel may use"),
    ("dynamic_shared_overrun", r"writes 8 byte\(s\) at 0x[0-9a-f]+, outside every tensor of the "
     r"launch"),
]  # fmt: skip
ACCESS_CHECKED = {
    "missing_syncthreads",
    "off_by_one",
    "uninitialised_shared",
    "atomic_race",
    "dynamic_shared_overrun",
}


@pytest.mark.parametrize("which, report", INJECTED_BUGS, ids=[b[0] for b in INJECTED_BUGS])
def test_injected_bug_fails_the_launch_with_a_report(which, report):
    if which in ACCESS_CHECKED and not _kernels.build_info().get("emulator_access_checks", False):
        pytest.skip(
            "this build leaves the emulators' access instrumentation out (the AddressSanitizer "
            "build)"
        )
    with pytest.raises(ValueError, match=report) as info:
        _kernels._cuda_emulator_selftest(which)
    assert "(emulated)" in str(info.value) and "selftest::" in str(info.value)


def test_correct_kernels_give_the_right_answer():
    """The same machinery runs correct kernels to completion: a shared-memory scan with
    barriers, a warp scan with shuffles and a ballot, atomics read after a barrier, a
    reduction in 64 KB of opted-in dynamic shared memory."""
    one_to_64 = np.arange(1, 65, dtype=np.int64)
    np.testing.assert_array_equal(_kernels._cuda_emulator_selftest("scan"), np.cumsum(one_to_64))
    per_warp = np.concatenate([np.cumsum(one_to_64[:32]), np.cumsum(one_to_64[32:])])
    np.testing.assert_array_equal(_kernels._cuda_emulator_selftest("warp_scan"), per_warp)
    np.testing.assert_array_equal(
        _kernels._cuda_emulator_selftest("atomic"), np.full(64, 63, np.int64)
    )
    words = 8192  # 64 KB of dynamic shared memory, allowed by cudaFuncSetAttribute
    np.testing.assert_array_equal(
        _kernels._cuda_emulator_selftest("dynamic_shared"),
        np.full(64, words * (words - 1) // 2, np.int64),
    )


def test_unknown_selftest_kernel_is_an_error():
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        _kernels._cuda_emulator_selftest("nope")


def _postprocess_inputs(bsz, width, seed):
    return make_state(np.random.default_rng(seed), bsz, width)


@pytest.mark.parametrize("shape", [0, 1])
def test_framework_free_ops_run_the_cuda_kernels_inside_cuda_emulation(shape):
    d, s, e, f = _postprocess_inputs(700, 5, seed=3)
    want = ref_postprocess(d.copy(), s.copy(), e.copy(), f.copy())["base_model_seq_lens_this_time"]
    before = _kernels._cuda_emulator_launches()
    _kernels.draft_model_postprocess(d, s.copy(), e, f)  # outside: the CPU kernel
    assert _kernels._cuda_emulator_launches() == before
    with _kernels.cuda_emulation(shape):
        _kernels.draft_model_postprocess(d, s, e, f)
    assert _kernels._cuda_emulator_launches() == before + 1
    np.testing.assert_array_equal(s, want)


def test_cuda_emulation_rejects_a_bad_shape():
    with pytest.raises(ValueError, match="shape must be 0 .* or 1"):
        _kernels.cuda_emulation(2)


def test_both_emulators_at_once_is_an_error():
    d, s, e, f = _postprocess_inputs(4, 3, seed=0)
    with _kernels.cuda_emulation(0), _kernels.xpu_emulation(1, 4):
        with pytest.raises(ValueError, match="both the CUDA and the XPU emulators are active"):
            _kernels.draft_model_postprocess(d, s, e, f)


def test_paddle_ops_run_the_cuda_kernels_inside_emulate():
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops
    from fastdeploy_mtp.ops._loader import _LIBRARY

    d, s, e, f = _postprocess_inputs(300, 4, seed=5)
    want = ref_postprocess(d.copy(), s.copy(), e.copy(), f.copy())["base_model_seq_lens_this_time"]
    results = {}
    for mode in ("cpu", "cuda0", "cuda1", "xpu"):
        t = [paddle.to_tensor(x.copy()) for x in (d, s, e, f)]
        if mode == "cpu":
            ops.draft_model_postprocess(*t)
            lib = ctypes.CDLL(_LIBRARY)
            lib.fdmtp_emulation_cuda_launches.restype = ctypes.c_int64
            launches = lib.fdmtp_emulation_cuda_launches()
        elif mode.startswith("cuda"):
            with ops.emulate("cuda", shape=int(mode[-1])):
                ops.draft_model_postprocess(*t)
            assert lib.fdmtp_emulation_cuda_launches() == launches + 1, mode
            launches += 1
        else:
            with ops.emulate("xpu", clusters=3, cores=5):
                ops.draft_model_postprocess(*t)
        results[mode] = t[1].numpy()
    for mode, got in results.items():
        np.testing.assert_array_equal(got, want, err_msg=mode)
    assert lib.fdmtp_emulation_cuda_launches() == launches  # the scopes are closed


@pytest.mark.parametrize(
    "kwargs, message",
    [({"kind": "tpu"}, "kind must be one of"), ({"kind": "cuda", "shape": 3}, "shape must be 0"),
     ({"kind": "xpu", "cores": 0}, "clusters and cores must be >= 1")],
)  # fmt: skip
def test_emulate_rejects_bad_arguments(kwargs, message):
    import fastdeploy_mtp.ops as ops

    with pytest.raises(ValueError, match=message):
        with ops.emulate(**kwargs):
            pass


def test_engine_generates_the_same_tokens_with_its_ops_on_the_cuda_emulator(request):
    """The reference engine (target + MTP proposer, K = 2, two substeps, n-gram hybrid) with
    every op running its CUDA kernels under the emulator generates exactly the tokens it
    generates with the CPU kernels."""
    pytest.importorskip("paddle")
    random_model = request.getfixturevalue("random_model")  # builds Paddle models
    import fastdeploy_mtp.ops as ops
    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.ops._loader import _LIBRARY
    from tests.support.engines import make_config, make_requests

    target, mtp = random_model
    cfg = make_config(2, 2, True, max_num_seqs=4)
    want = build_engine(cfg, target, mtp).generate(make_requests(5, 4))
    lib = ctypes.CDLL(_LIBRARY)
    lib.fdmtp_emulation_cuda_launches.restype = ctypes.c_int64
    before = lib.fdmtp_emulation_cuda_launches()
    with ops.emulate("cuda", shape=1):
        got = build_engine(cfg, target, mtp).generate(make_requests(5, 4))
    launches = lib.fdmtp_emulation_cuda_launches() - before
    assert got == want
    assert launches > 50, (
        f"only {launches} emulated launches: the engine's ops did not run the CUDA kernels"
    )
