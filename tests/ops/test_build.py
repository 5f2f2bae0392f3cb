"""The build and the loader: backends reported, one registration per process, and a
clear error (not a crash) from CUDA paths where no GPU is usable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastdeploy_mtp.ops as ops
from fastdeploy_mtp import _kernels


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_backends_reports_what_is_compiled_in():
    info = ops.build_info()
    assert ops.backends() == {"cpu": True, "cuda": info["cuda"], "xpu": False}
    # the CUDA arch list is reported exactly when CUDA kernels were compiled in
    assert bool(info["cuda_archs"]) == info["cuda"]


def test_backends_command_from_the_readme():
    proc = run_python("import fastdeploy_mtp.ops as o; print(o.backends())")
    assert proc.returncode == 0, proc.stderr
    assert "'cpu': True" in proc.stdout


def test_cuda_status_gives_a_reason():
    usable, reason = ops.cuda_status()
    assert isinstance(usable, bool) and reason
    if not ops.backends()["cuda"]:
        assert not usable and "without CUDA" in reason


def test_cuda_launch_without_a_usable_gpu_is_a_clear_error():
    usable, _ = ops.cuda_status()
    if usable:
        pytest.skip("a GPU is usable here; the CUDA path is exercised by the op tests")
    # Raw-pointer arguments on a CUDA device: the launch must fail cleanly before any
    # memory is touched (the pointers are never dereferenced on the host).
    fake = [
        (0x1000, "int64", (4, 3), "cuda:0"),
        (0x2000, "int32", (4,), "cuda:0"),
        (0x3000, "int32", (4,), "cuda:0"),
        (0x4000, "bool", (4, 1), "cuda:0"),
    ]
    with pytest.raises(ValueError) as info:
        _kernels.draft_model_postprocess(*fake)
    message = str(info.value)
    assert message.startswith("draft_model_postprocess: ")
    if ops.backends()["cuda"]:
        assert "CUDA launch failed: cuda" in message
    else:
        assert "no CUDA kernels" in message


def test_raw_pointer_tuples_drive_the_cpu_kernel():
    draft = np.array([[1, -1, 2], [-1, -1, -1]], np.int64)
    slt = np.array([9, 9], np.int32)
    enc = np.zeros(2, np.int32)
    stop = np.zeros((2, 1), bool)
    args = [(a.ctypes.data, str(a.dtype), a.shape, "cpu") for a in (draft, slt, enc, stop)]
    _kernels.draft_model_postprocess(*args)
    np.testing.assert_array_equal(slt, [2, 0])


def test_bad_raw_tuple_names_the_argument():
    a = np.zeros(2, np.int32)
    with pytest.raises(ValueError, match="`base_model_draft_tokens`: unknown dtype 'int63'"):
        _kernels.draft_model_postprocess(
            (a.ctypes.data, "int63", (2, 1), "cpu"), a, a, np.zeros((2, 1), bool)
        )
    with pytest.raises(ValueError, match="`base_model_seq_lens_this_time` must support __dlpack__"):
        _kernels.draft_model_postprocess(
            np.zeros((2, 1), np.int64), [1, 2], a, np.zeros((2, 1), bool)
        )


def test_library_is_registered_once_even_across_reload():
    pytest.importorskip("paddle")
    proc = run_python(
        """
        import importlib
        import paddle
        import fastdeploy_mtp.ops as ops
        from fastdeploy_mtp.ops import _loader
        first = _loader._load_paddle_api()
        importlib.reload(_loader)
        importlib.reload(ops)
        assert _loader._load_paddle_api() is first
        t = paddle.to_tensor([[1, 2]], dtype="int64")
        s = paddle.to_tensor([0], dtype="int32")
        ops.draft_model_postprocess(t, s, paddle.zeros([1], "int32"), paddle.zeros([1, 1], "bool"))
        print("count", int(s.numpy()[0]))
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "count 2" in proc.stdout


def test_clash_with_ops_registered_elsewhere_raises_instead_of_aborting():
    pytest.importorskip("paddle")
    proc = run_python(
        """
        import paddle
        from paddle.utils.cpp_extension import extension_utils
        from fastdeploy_mtp.ops import _loader
        # Another library registering the same op names first (here: the same file loaded
        # behind the loader's back, as a second copy of the package would).
        extension_utils.load_op_meta_info_and_register_op(_loader._LIBRARY)
        try:
            _loader._load_paddle_api()
        except RuntimeError as e:
            print("refused:", e)
        """
    )
    assert proc.returncode == 0, f"interpreter died ({proc.returncode}): {proc.stderr[-2000:]}"
    assert "refused:" in proc.stdout and "draft_model_postprocess" in proc.stdout


def test_op_names_list_every_registered_op():
    """OP_NAMES (the clash guard) must name exactly the ops the library registers."""
    pytest.importorskip("paddle")
    proc = run_python(
        """
        from paddle.utils.cpp_extension import extension_utils
        from fastdeploy_mtp.ops import _loader
        names = extension_utils.load_op_meta_info_and_register_op(_loader._LIBRARY)
        print(sorted(names) == sorted(_loader.OP_NAMES), sorted(set(names) ^ set(_loader.OP_NAMES)))
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("True"), proc.stdout
