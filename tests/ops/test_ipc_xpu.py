"""The XPU runtime variant of set_data_ipc / share_external_data / unset_data_ipc on the
`xpu-emu` backend: "device memory" comes from the emulated XRE (custom_ops/xpu/emu/
xre_emu.h: xpu_malloc regions in /dev/shm), host arrays inside `_kernels.xpu_emulation` are
treated as XPU tensors, and handles go through xpu_ipc_get_memhandle /
xpu_ipc_open_memhandle / xpu_ipc_close_memhandle exactly as on a Kunlun device
(custom_ops/xpu/runtime/ipc.cpp). A real second process attaches with use_ipc=True; the
creator's own process attaches with use_ipc=False (upstream's XPU attr)."""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

_kernels = pytest.importorskip("fastdeploy_mtp._kernels")

SHM = Path("/dev/shm")
pytestmark = [
    pytest.mark.skipif(not SHM.is_dir(), reason="needs POSIX shared memory at /dev/shm"),
    pytest.mark.skipif(
        not _kernels.build_info().get("xpu_emulator", False),
        reason="built with the real XPU toolchain (no emulated XRE)",
    ),
]
ROOT = Path(__file__).resolve().parents[2]
LAUNCH = (2, 4)  # the emulation scope's launch shape (no kernel runs in these ops)


def regions(pid: int):
    """Emulated device allocations (xpu_malloc) of process `pid` still in /dev/shm."""
    return sorted(p.name for p in SHM.iterdir() if p.name.startswith(f"fdmtpxe.{pid}."))


def mapped(segment: str) -> int:
    lines = Path("/proc/self/maps").read_text().splitlines()
    return sum(
        1 for line in lines if line.removesuffix(" (deleted)").endswith("/dev/shm/" + segment)
    )


@pytest.fixture
def name():
    assert regions(os.getpid()) == []
    tag = f"fdmtpx{uuid.uuid4().hex[:8]}"
    yield tag
    left = [p.name for p in SHM.iterdir() if p.name.startswith(tag)] + regions(os.getpid())
    for n in left:
        (SHM / n).unlink(missing_ok=True)
    assert not left, f"/dev/shm leftovers: {left}"


def header(name: str):
    """The segment header's fields: (size, nprocesses, handle bytes, kind, dtype code,
    data_bytes, creator_pid, data_ptr_addr)."""
    raw = (SHM / name).read_bytes()
    nproc = struct.unpack_from("<Q", raw, 0)[0]
    magic, version, kind, dtype, device = struct.unpack_from("<QIIii", raw, 72)
    data_bytes, data_offset, creator, ptr = struct.unpack_from("<QQqQ", raw, 96)
    assert magic == 0x4350494D54504446 and version == 1 and device == 0 and data_offset == 0
    return len(raw), nproc, raw[8:72], kind, data_bytes, creator, ptr


def publish(shape, dtype, name):
    """An emulated-XPU tensor published under `name`; returns (device buffer, numpy view)."""
    buf = _kernels.xpu_emu_empty(shape, dtype)
    view = np.from_dlpack(buf)
    view[...] = (np.arange(view.size) % 100).reshape(shape).astype(dtype)
    with _kernels.xpu_emulation(*LAUNCH):
        assert _kernels.set_data_ipc(buf, name) is None  # a device tensor stays where it is
    return buf, view


CREATOR = textwrap.dedent(
    """
    import sys
    import numpy as np
    from fastdeploy_mtp import _kernels
    name = sys.argv[1]
    buf = _kernels.xpu_emu_empty((4, 6), "float32")
    mine = np.from_dlpack(buf)
    mine[...] = np.arange(24, dtype=np.float32).reshape(4, 6)
    with _kernels.xpu_emulation(2, 4):
        assert _kernels.set_data_ipc(buf, name) is None
    print("READY", buf.data_ptr, flush=True)
    sys.stdin.readline()                      # the attacher has written
    assert mine[1, 2] == -7.0, mine
    mine[3, 5] = 42.0
    print("WROTE", flush=True)
    sys.stdin.readline()                      # the attacher has detached
    _kernels.unset_data_ipc(buf, name, True, True)
    del mine, buf                             # xpu_free: the emulated allocation goes
    print("CREATOR-OK", flush=True)
    """
)


def assert_attach_refused(name, shape, use_ipc, match, dtype=np.float32):
    """`share_external_data` of segment `name` inside the emulation scope raises a
    ValueError matching `match`."""
    with _kernels.xpu_emulation(*LAUNCH), pytest.raises(ValueError, match=match):
        _kernels.share_external_data(np.empty((), dtype), name, shape, use_ipc)


def _spawn(script: str, name: str) -> subprocess.Popen:
    """`script` in a child Python process (argument: the segment name), lines in and out."""
    return subprocess.Popen(
        [sys.executable, "-c", script, name],
        cwd=ROOT,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


@contextlib.contextmanager
def _child(script: str, name: str, ok: str):
    """`script` in a child process (see _spawn) for the body of the with statement; then the
    child is told "done" and must exit 0 having printed `ok` and leaving neither the segment
    nor a device region behind. If the body fails, the child is killed instead."""
    child = _spawn(script, name)
    try:
        yield child
        child.stdin.write("done\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0 and ok in out, out
    assert not (SHM / name).exists() and regions(child.pid) == []


def test_xpu_ipc_between_two_processes_writes_both_ways_and_tears_down_clean(name):
    with _child(CREATOR, name, "CREATOR-OK") as creator:
        ready = creator.stdout.readline().split()
        assert ready[:1] == ["READY"], ready
        size, nproc, handle, kind, data_bytes, pid, ptr = header(name)
        assert (size, nproc, kind, data_bytes, pid, ptr) == (
            128,
            0,
            3,
            96,
            creator.pid,
            int(ready[1]),
        )
        assert any(handle) and len(regions(creator.pid)) == 1  # the creator's device allocation
        placeholder = np.empty((), np.float32)
        with _kernels.xpu_emulation(*LAUNCH):
            # upstream would dereference the creator's pointer here; we refuse
            with pytest.raises(
                ValueError,
                match=rf"`use_ipc`=False reuses the device pointer stored by the "
                rf"creator, valid only in the creating process \(pid {creator.pid}\), "
                rf"but this is pid {os.getpid()}; attach with use_ipc=True",
            ):
                _kernels.share_external_data(placeholder, name, [4, 6], False)
            att = _kernels.share_external_data(placeholder, name, [4, 6], True)
        assert att.device == "xpu:0" and att.shape == (4, 6) and att.nbytes == 96
        theirs = np.from_dlpack(att)
        np.testing.assert_array_equal(theirs, np.arange(24, dtype=np.float32).reshape(4, 6))
        theirs[1, 2] = -7.0  # attacher -> creator
        creator.stdin.write("go\n")
        creator.stdin.flush()
        assert creator.stdout.readline().strip() == "WROTE"
        assert theirs[3, 5] == 42.0  # creator -> attacher
        region = regions(creator.pid)[0]
        assert mapped(region) == 1
        _kernels.unset_data_ipc(att, name, True, False)  # attacher's teardown
        del theirs
        assert att.closed and mapped(region) == 0  # xpu_ipc_close_memhandle ran


def test_use_ipc_false_in_the_creating_process_reuses_the_device_pointer(name):
    buf, mine = publish((3, 4), "float16", name)
    size, nproc, handle, kind, data_bytes, pid, ptr = header(name)
    assert (size, nproc, kind, data_bytes, pid, ptr) == (128, 0, 3, 24, os.getpid(), buf.data_ptr)
    with _kernels.xpu_emulation(*LAUNCH):
        att = _kernels.share_external_data(np.empty((), np.float16), name, [2, 4], False)
        # an IPC handle does not open in the process that exported it (as CUDA IPC)
        with pytest.raises(
            ValueError,
            match=r"xpu_ipc_open_memhandle failed .*exported by this process.*"
            r"in the creating process attach with use_ipc=False",
        ):
            _kernels.share_external_data(np.empty((), np.float16), name, [3, 4], True)
    assert att.data_ptr == buf.data_ptr and att.device == "xpu:0" and att.nbytes == 16
    view = np.from_dlpack(att)
    view[1, 3] = 5.0
    mine[0, 0] = -1.0
    assert mine[1, 3] == 5.0 and view[0, 0] == -1.0
    _kernels.unset_data_ipc(att, name, True, True)
    assert not (SHM / name).exists()
    del view, att, mine, buf
    assert regions(os.getpid()) == []  # the device allocation was freed with its last view


def test_use_ipc_false_after_the_creator_freed_its_tensor_is_an_error(name):
    buf, mine = publish((8,), "uint8", name)
    del buf, mine  # freed: the stored pointer dangles
    assert_attach_refused(
        name,
        [8],
        False,
        match=rf"`use_ipc`=False: the device memory published as `{name}` is no "
        r"longer allocated .* the creator's tensor was freed",
        dtype=np.uint8,
    )
    _kernels.unset_data_ipc(None, name, False, True)


def test_bad_inputs_are_errors_naming_the_problem(name):
    placeholder = np.empty((), np.float32)
    with _kernels.xpu_emulation(*LAUNCH):
        with pytest.raises(
            ValueError, match=rf"^share_external_data: no shared-memory segment named `{name}`"
        ):
            _kernels.share_external_data(placeholder, name, [1], True)
        # ordinary host memory is not device memory: nothing to export, nothing created
        with pytest.raises(
            ValueError,
            match=r"^set_data_ipc: cannot export `tmp_input`: xpu_ipc_get_memhandle "
            r"failed .*not in device memory allocated by this process",
        ):
            _kernels.set_data_ipc(np.zeros(4, np.float32), name)
        assert not (SHM / name).exists()
    buf, _ = publish((4, 6), "float32", name)
    with _kernels.xpu_emulation(*LAUNCH):
        with pytest.raises(
            ValueError, match=r"dtype mismatch: `input` is bfloat16 but segment .* holds a float32"
        ):
            _kernels.share_external_data((0, "bfloat16", (), "cpu"), name, [4, 6], False)
        with pytest.raises(
            ValueError, match=r"`shape` \[5, 6\] needs 120 bytes but segment .* holds 96 bytes"
        ):
            _kernels.share_external_data(placeholder, name, [5, 6], False)
    # an XPU segment needs an XPU placeholder, and a host segment a host one
    with pytest.raises(
        ValueError,
        match=r"holds an XPU IPC handle but `input` is on cpu; attach with a "
        r"placeholder on the XPU device "
        r"\(emulator: a host array inside xpu_emulation\)",
    ):
        _kernels.share_external_data(placeholder, name, [4, 6])
    with pytest.raises(
        ValueError, match=r"`use_ipc`=False .* applies to XPU tensors only; `input` is on cpu"
    ):
        _kernels.share_external_data(placeholder, name, [4, 6], False)
    _kernels.unset_data_ipc(None, name, False, True)
    host = _kernels.set_data_ipc(np.ones(3, np.float32), name)
    with _kernels.xpu_emulation(*LAUNCH):
        with pytest.raises(
            ValueError,
            match=r"holds host memory but `input` is emulated XPU memory \(inside "
            r"xpu_emulation\); attach with a placeholder on the CPU \(outside",
        ):
            _kernels.share_external_data(placeholder, name, [3])
    _kernels.unset_data_ipc(host, name, True, True)
    del buf, host


def test_xpu_device_tensors_need_an_xpu_build(name):
    with pytest.raises(
        ValueError,
        match=r"`tmp_input` is an XPU tensor but this build of fastdeploy_mtp has no "
        r"XPU support",
    ):
        _kernels.set_data_ipc((0, "float32", (4,), "xpu:0"), name)
    with pytest.raises(ValueError, match=r"`input` is an XPU tensor but this build"):
        _kernels.share_external_data((0, "float32", (), "xpu:0"), name, [4], True)
    assert not (SHM / name).exists()


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
def test_the_real_xre_branch_compiles_against_the_assumed_xre_api(tmp_path):
    """FDMTP_WITH_XPU=ON cannot be built here (no SDK); its IPC code is compiled against
    tests/ops/xre_api/xpu/runtime.h (the XRE API as we assume it) with our warning flags,
    and against the headers generated from the op declarations."""
    gen = subprocess.run(
        [sys.executable, "custom_ops/codegen/op_codegen.py", "--repo", ".", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert gen.returncode == 0, gen.stderr
    for src in ("custom_ops/xpu/runtime/xpu_ipc.cpp", "custom_ops/entry/ipc_entries.cc"):
        proc = subprocess.run(
            [
                "c++",
                "-std=c++17",
                "-fsyntax-only",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-DFDMTP_WITH_XPU",
                "-Icustom_ops",
                f"-I{tmp_path / 'include'}",
                "-Icustom_ops/include",
                "-Icustom_ops/entry",
                "-Itests/ops/xre_api",
                src,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, f"{src}:\n{proc.stderr}"


HOLDER = textwrap.dedent(
    """
    import sys
    from fastdeploy_mtp import _kernels
    name = sys.argv[1]
    buf = _kernels.xpu_emu_empty((8,), "float32")
    with _kernels.xpu_emulation(2, 4):
        assert _kernels.set_data_ipc(buf, name) is None
    print("READY", flush=True)
    sys.stdin.readline()
    _kernels.unset_data_ipc(buf, name, True, True)
    del buf
    print("HOLDER-OK", flush=True)
    """
)


def test_opening_an_emulated_region_others_can_access_is_refused(name):
    """The emulated XRE opens a handle's device region only if it is a mode-0600 region of
    this uid (xpu_malloc's): a region made group/other-accessible is refused."""
    with _child(HOLDER, name, "HOLDER-OK") as holder:
        assert holder.stdout.readline().strip() == "READY"
        region = regions(holder.pid)[0]
        os.chmod(SHM / region, 0o666)
        assert_attach_refused(
            name,
            [8],
            True,
            match=rf"xpu_ipc_open_memhandle failed .*emulated device region `{region}` is not "
            r"a mode-0600 region of uid \d+ \(owner uid \d+\); refusing to open it",
        )
        os.chmod(SHM / region, 0o600)
        with _kernels.xpu_emulation(*LAUNCH):
            att = _kernels.share_external_data(np.empty((), np.float32), name, [8], True)
        _kernels.unset_data_ipc(att, name, True, False)
