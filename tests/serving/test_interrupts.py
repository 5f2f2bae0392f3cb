"""Ctrl-C at any moment: SIGINT to the whole process group, as a terminal sends it, during
``serve``'s start-up (its imports; its children importing Paddle), once it is ready (TP 2,
whose output until then must be ours alone: no glog line, no Paddle FLAGS banner, no
uvicorn line), and during ``generate`` and ``router``. Each must exit with status 130 after
one line saying so, print no traceback (the children get the SIGINT too), and leave no
process, shared-memory name, SysV queue or runtime directory behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from fastdeploy_mtp.distributed import find_free_port_range
from fastdeploy_mtp.serving.processes import runtime_dir
from tests.support.servers import (
    alive,
    descendants,
    device_ids,
    own_names,
    queues_with_id,
    shm_names,
)

#: what only Paddle, glog, Mooncake, uvicorn or an uncaught exception print
NOISE = re.compile(
    r"Traceback|KeyboardInterrupt|FatalError|Modified FLAGS|^[IWEF]\d{4} |^INFO:", re.MULTILINE
)


class Interrupted:
    """``python -m fastdeploy_mtp.entrypoints.cli argv`` in a session of its own, sent SIGINT
    (to its whole process group) ``delay`` seconds after it printed a line containing
    ``marker`` (after its start when ``marker`` is ``None``). Attributes once it ran:
    ``code`` (exit status), ``output`` (stdout and stderr), ``before`` (the output up to the
    signal), ``children`` (its descendants at the signal). ``presses``: how many times the
    signal is sent, 0.1 s apart (an impatient user presses Ctrl-C again)."""

    def __init__(self, argv: list[str], marker: str | None, delay: float = 0.0, presses: int = 1):
        # a child inherits an ignored SIGINT: the CLI would then be right to ignore Ctrl-C
        assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN, "this process ignores SIGINT"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fastdeploy_mtp.entrypoints.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        seen = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.append(line)
                if marker is not None and marker in line:
                    seen.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            if marker is not None:
                assert seen.wait(180), f"no {marker!r} line:\n{''.join(lines)}"
            else:
                assert _wait_sigint_blocked(self.proc.pid, 60), "SIGINT never held back"
            time.sleep(delay)
            self.before = "".join(lines)
            self.children = descendants(self.proc.pid)
            for press in range(presses):
                if press:
                    time.sleep(0.1)
                os.killpg(self.proc.pid, signal.SIGINT)
            self.code = self.proc.wait(60)
        finally:
            if self.proc.poll() is None:  # it did not stop: the test fails, nothing is left
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            reader.join(30)
        self.output = "".join(lines)

    def live_children(self, settle: float = 10.0) -> list[int]:
        """Its descendants at the signal still alive after up to ``settle`` seconds (a child
        of a child, orphaned, may take a moment to be reaped)."""
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            if not any(alive(p) for p in self.children):
                return []
            time.sleep(0.1)
        return [p for p in self.children if alive(p)]


def _wait_sigint_blocked(pid: int, timeout: float) -> bool:
    """Wait until process ``pid``'s main thread blocks SIGINT (``SigBlk`` in its
    ``/proc/PID/status``, a hexadecimal mask whose bit ``signum - 1`` is that signal's)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except FileNotFoundError:
            return False
        blocked = int(status.split("SigBlk:")[1].split()[0], 16)
        if blocked >> (signal.SIGINT - 1) & 1:
            return True
        time.sleep(0.002)
    return False


def check_quiet_130(run: Interrupted, line: str) -> None:
    """Exit status 130 as the shell reports it (``$?``: the process returned 130, or, when
    the interrupt reached it once more while it finished, it ended by SIGINT, which a shell
    also reports as 128 + 2 = 130); of the lines after the signal, exactly one says ``line``;
    no noise."""
    assert run.code in (130, -signal.SIGINT), run.output
    assert not NOISE.search(run.output), run.output
    after = [ln for ln in run.output[len(run.before) :].splitlines() if ln.strip()]
    assert len([ln for ln in after if line in ln]) == 1 and len(after) <= 2, run.output


@pytest.mark.parametrize(
    "marker, delay, tp, presses",
    [
        (None, 0.3, 1, 1),  # the main process's imports (Paddle's among them)
        ("starting worker rank 0", 0.0, 1, 1),  # the children's start: Python, then Paddle
        ("ready in", 0.3, 2, 1),  # serving (TP 2: two workers, a gloo group)
        ("ready in", 0.3, 1, 3),  # Ctrl-C pressed again while it stops
    ],
    ids=["imports", "children-starting", "ready-tp2", "ready-pressed-thrice"],
)
def test_ctrl_c_during_serve_is_one_line_130_and_leaves_nothing(marker, delay, tp, presses):
    port = find_free_port_range(2)
    devices = device_ids(tp)
    shm_before = shm_names()
    argv = ["serve", "--port", str(port), "--engine-worker-queue-port", str(port + 1)]
    argv += ["--device-ids", devices, "-tp", str(tp), "--max-num-seqs", "4"]
    run = Interrupted(argv, marker, delay, presses)
    check_quiet_130(run, "interrupted")
    if marker == "ready in":  # until ready, every line is one of ours
        assert all(
            ln.startswith(("[serve ", "[cache manager] ")) for ln in run.before.splitlines()
        ), run.before
    ids = [int(d) for d in devices.split(",")]
    assert run.live_children() == [], run.output
    assert own_names(shm_names() - shm_before, port + 1, ids) == [], run.output
    assert not queues_with_id(port + 1)
    assert not runtime_dir.deployment_dir(port + 1).exists()


@pytest.mark.parametrize("delay", [0.3, 1.0], ids=["imports", "loading"])
def test_ctrl_c_during_generate_is_one_line_130(delay):
    run = Interrupted(["generate", "--prompt", "x", "--max-tokens", "3000"], None, delay)
    check_quiet_130(run, "fastdeploy-mtp: interrupted")
    assert run.live_children() == []


def test_ctrl_c_while_the_router_waits_for_instances_is_one_line_130():
    port = find_free_port_range(3)
    url = "http://127.0.0.1:{}".format
    argv = ["router", "--port", str(port), "--prefill", url(port + 1), "--decode", url(port + 2)]
    run = Interrupted(argv, "waiting for", 0.2)
    check_quiet_130(run, "interrupted during start-up")
