"""A hostile local user for the trust tests: code run as another uid (``nobody``, through
``setpriv``) that talks to a deployment's ports with the standard library only.

The test suite's virtual environment may sit in a directory other users cannot enter, so
the hostile side imports nothing but the standard library: :data:`ZMTP_CLIENT` is a minimal
ZeroMQ (ZMTP 3.0, NULL mechanism) DEALER written for these tests, enough to send one-frame
requests to a ROUTER and read its answers (its exact read is the package's own, copied into
the script as source). :func:`run_as_nobody` writes a script into a
fresh world-readable directory and runs it with the system's ``python3`` as ``nobody``.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import tempfile
from typing import Any

from fastdeploy_mtp.distributed import _recv_exact

#: ``zmtp_request(host, port, frames, timeout) -> list[bytes] | None``: connect as a ZeroMQ
#: DEALER, send ``frames`` as one message, return the first answer's frames (``None``: no
#: answer within ``timeout`` or the peer closed the connection).
ZMTP_CLIENT = (
    "import socket, struct, time\n\n"
    # reading exactly n bytes is the tensor-parallel rendezvous's own function, copied in
    + inspect.getsource(_recv_exact)
    + r"""
def _frame(body, more=False, command=False):
    flags = (1 if more else 0) | (4 if command else 0)
    if len(body) > 255:
        return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body

def _read_frame(sock):
    flags = _recv_exact(sock, 1)[0]
    size = struct.unpack(">Q", _recv_exact(sock, 8))[0] if flags & 2 else _recv_exact(sock, 1)[0]
    return flags, _recv_exact(sock, size)

def zmtp_request(host, port, frames, timeout=5.0):
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        greeting = (
            b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00")
            + b"\x00" + b"\x00" * 31
        )
        sock.sendall(greeting)
        _recv_exact(sock, 64)
        prop = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
        sock.sendall(_frame(b"\x05READY" + prop, command=True))
        flags, body = _read_frame(sock)  # the peer's READY
        for i, f in enumerate(frames):
            sock.sendall(_frame(f, more=i < len(frames) - 1))
        answer = []
        while True:
            flags, body = _read_frame(sock)
            if flags & 4:
                continue  # a command (e.g. a heartbeat)
            answer.append(body)
            if not flags & 1:
                return answer
    except (OSError, ConnectionError):
        return None
    finally:
        sock.close()
"""
)


def run_as_nobody(script: str, timeout: float = 60.0) -> Any:
    """Run ``script`` (Python source; it may call ``zmtp_request``) as ``nobody`` with the
    system ``python3``; returns what it printed last as JSON. Fails the test if it did not
    exit 0."""
    python = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
    folder = tempfile.mkdtemp(prefix="fdmtp-hostile-")
    try:
        os.chmod(folder, 0o755)
        path = os.path.join(folder, "hostile.py")
        with open(path, "w") as f:
            f.write(ZMTP_CLIENT + "\n" + script)
        os.chmod(path, 0o644)
        cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python, path]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert out.returncode == 0, (
        f"the hostile script failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
