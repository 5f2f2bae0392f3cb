"""What ``serve`` and ``router`` share while they start: their options' defaults, the
process's start (:func:`process_started`: what the progress lines and the "ready" figure
count from), a progress line per stage on stderr, and SIGTERM/SIGINT turned into
``KeyboardInterrupt`` so a start-up that waits (for workers, for instances) unwinds through
its clean-up instead of dying with children left."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any


def option_defaults(options: type) -> dict[str, Any]:
    """The defaults of an options dataclass (``ServeOptions``, ``RouterOptions``), by field
    name: the command line shows and uses these, so each default is written once."""
    return {
        f.name: f.default
        for f in dataclasses.fields(options)
        if f.default is not dataclasses.MISSING
    }


def process_started() -> float:
    """When this process started, as a ``time.perf_counter()`` value: its start time in
    ``/proc/self/stat`` (clock ticks after boot) against ``CLOCK_BOOTTIME``, so the time to
    ready includes the interpreter's start and the imports. Where ``/proc`` cannot tell, now."""
    from .runtime_dir import process_start

    now = time.perf_counter()
    ticks = process_start(os.getpid())
    if ticks is None:
        return now
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return now - max(0.0, age)


def progress_printer(label: str, t0: float) -> Callable[[str], None]:
    """A function printing ``[label  1.23s] line`` (seconds since ``t0``, a
    ``time.perf_counter()`` value) to stderr."""

    def progress(line: str) -> None:
        print(f"[{label} {time.perf_counter() - t0:6.2f}s] {line}", file=sys.stderr, flush=True)

    return progress


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT raise ``KeyboardInterrupt`` in the main
    thread; the previous handlers come back when it ends."""
    old = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
