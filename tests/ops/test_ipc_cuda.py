"""CUDA IPC across two processes (the `cuda` backend only; run by scripts/gpu_check.sh).

A creator subprocess holds torch CUDA tensors (one at an offset inside a larger
allocation), exports them with _kernels.set_data_ipc; this process attaches them with
share_external_data, checks the creator's pattern, writes its own; the creator checks it.
CUDA IPC cannot open a handle in the exporting process, so two processes are required.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from fastdeploy_mtp import _kernels

CREATOR = """
import sys, torch
from fastdeploy_mtp import _kernels
tag = sys.argv[1]
whole = torch.arange(4096 + 3 * 64, dtype=torch.float32, device="cuda")
inner = whole[4096:]  # an interior pointer: the handle is the allocation's, plus an offset
half = (torch.arange(256, device="cuda") % 97).to(torch.bfloat16)
assert _kernels.set_data_ipc(inner, tag + "inner") is None
assert _kernels.set_data_ipc(half, tag + "half") is None
torch.cuda.synchronize()
print("READY", flush=True)
sys.stdin.readline()
ok = bool(torch.all(inner == -1).item()) and bool(torch.all(half == 3).item())
expected = torch.arange(4096, device="cuda", dtype=torch.float32)
ok = ok and bool(torch.all(whole[:4096] == expected).item())
for n in ("inner", "half"):
    _kernels.unset_data_ipc(None, tag + n, False, True)
print("CREATOR-OK" if ok else "MISMATCH", flush=True)
"""


@pytest.mark.only_backend("cuda")
@pytest.mark.parametrize("backend", ["cuda"], indirect=True)
def test_cuda_ipc_between_two_processes(backend):
    torch = pytest.importorskip("torch")
    tag = f"fdmtpc{uuid.uuid4().hex[:8]}_"
    root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CREATOR), tag],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "READY" in line, line + proc.stdout.read()
        inner = _kernels.share_external_data(torch.empty((), device="cuda"), tag + "inner", [3, 64])
        half = _kernels.share_external_data(
            torch.empty((), dtype=torch.bfloat16, device="cuda"), tag + "half", [256]
        )
        assert inner.device.startswith("cuda") and inner.nbytes == 3 * 64 * 4
        ti, th = torch.from_dlpack(inner), torch.from_dlpack(half)
        want = torch.arange(4096, 4096 + 192, dtype=torch.float32, device="cuda").reshape(3, 64)
        assert torch.equal(ti, want)
        assert torch.equal(th, (torch.arange(256, device="cuda") % 97).to(torch.bfloat16))
        with pytest.raises(ValueError, match="dtype mismatch"):
            _kernels.share_external_data(torch.empty((), device="cuda"), tag + "half", [1])
        with pytest.raises(ValueError, match="needs 772 bytes"):
            _kernels.share_external_data(torch.empty((), device="cuda"), tag + "inner", [193])
        ti.fill_(-1)
        th.fill_(3)
        torch.cuda.synchronize()
        del ti, th
        inner.close()
        half.close()
        out, _ = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "CREATOR-OK" in out, out
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(tag)]
