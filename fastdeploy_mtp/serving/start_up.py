"""What ``serve`` and ``router`` share while they start: a progress line per stage on stderr,
and SIGTERM/SIGINT turned into ``KeyboardInterrupt`` so a start-up that waits (for workers,
for instances) unwinds through its clean-up instead of dying with children left."""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterator


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
