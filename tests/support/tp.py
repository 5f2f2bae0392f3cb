"""Starting the ranks of a tensor-parallel test: one ``tests/support/tp_child.py`` process per rank,
bounded by a hard timeout and killed in a ``finally`` (no orphans)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastdeploy_mtp.distributed import find_free_port_range

CHILD = str(Path(__file__).with_name("tp_child.py"))


def run_ranks(
    role: str, world: int, *extra: str, timeout: float = 90.0, ranks: list[int] | None = None
) -> list[dict]:
    """Run ``role`` as ranks ``ranks`` (default all) of a ``world``-rank group on free ports;
    return each rank's JSON result (``_seconds``: the wall time of the whole run). Fails with
    every rank's output when one exits non-zero or the run outlasts ``timeout`` seconds."""
    ranks = list(range(world)) if ranks is None else ranks
    port = find_free_port_range(world + 1)
    with tempfile.TemporaryDirectory(prefix="fdmtp_tp_") as tmp:
        outs = [str(Path(tmp) / f"rank{r}.json") for r in ranks]
        logs = [open(Path(tmp) / f"rank{r}.log", "w+") for r in ranks]  # noqa: SIM115
        procs: list[subprocess.Popen] = []
        t0 = time.monotonic()
        try:
            for r, out, log in zip(ranks, outs, logs):
                cmd = [
                    sys.executable,
                    "-W",
                    "ignore",
                    CHILD,
                    role,
                    str(r),
                    str(world),
                    str(port),
                    out,
                    *extra,
                ]
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            deadline = t0 + timeout
            for p in procs:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            seconds = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{role}: ranks did not finish in {timeout} s\n{_logs(logs)}"
            ) from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.flush()
        failed = [(r, p.returncode) for r, p in zip(ranks, procs) if p.returncode != 0]
        if failed:
            raise AssertionError(f"{role}: rank(s) exited non-zero {failed}\n{_logs(logs)}")
        results = [json.loads(Path(o).read_text()) for o in outs]
        for log in logs:
            log.close()
    for res in results:
        res["_seconds"] = seconds
    return results


def _logs(logs) -> str:
    text = []
    for log in logs:
        log.flush()
        log.seek(0)
        text.append(f"--- {log.name}\n{log.read()[-4000:]}")
    return "\n".join(text)
