"""Run one op call in a child process: for length values such as 2**31 - 1, whose cost must
be bounded by the buffer sizes, not by the values (a regression would hang or take seconds;
the generous timeout only catches that, it is no timing assertion)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import pickle, sys
import numpy as np
from tests.backends import availability
backend_name, op, tensors, attrs, outputs = pickle.load(sys.stdin.buffer)
backend, reason = availability(backend_name)
assert backend is not None, reason
got = backend.run(op, tensors, attrs, outputs)
sys.stdout.buffer.write(pickle.dumps([None if g is None else np.asarray(g) for g in got]))
"""


def run_in_child(backend, op, tensors, attrs=(), outputs=(), timeout=300.0):
    """backend.run(op, ...) in a fresh interpreter; returns its tensors (as backend.run)."""
    payload = pickle.dumps((backend.name, op, list(tensors), tuple(attrs), list(outputs)))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], input=payload, capture_output=True, cwd=ROOT, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{op} child failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}"
    return pickle.loads(proc.stdout)
