"""What ``serve`` and ``router`` share while they start: their options' defaults, the
process's start (:func:`process_started`: what the progress lines and the "ready" figure
count from), a progress line per stage on stderr at a ``--log-level``
(:class:`Progress`), Paddle's, glog's and Mooncake's own logging kept quiet below
``debug`` (:func:`apply_log_level`), Paddle imported without its signal handlers
(:func:`import_paddle`), and SIGTERM/SIGINT turned into ``KeyboardInterrupt`` so a start-up
that waits (for workers, for instances) unwinds through its clean-up instead of dying with
children left."""

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


#: ``--log-level`` choices, most verbose first
LOG_LEVELS = ("debug", "info", "warning", "error")

#: what the native libraries log below ``--log-level debug``: glog (Paddle's C++ core, the
#: Mooncake transfer engine) only errors, Mooncake's own level the same (its variable
#: overrides glog's); a variable the user set is kept
_QUIET_NATIVE_LOGS = {"GLOG_minloglevel": "2", "GLOG_v": "0", "MC_LOG_LEVEL": "ERROR"}


def shows(log_level: str, level: str) -> bool:
    """Whether a line of ``level`` is printed at ``--log-level log_level``."""
    return LOG_LEVELS.index(level) >= LOG_LEVELS.index(log_level)


class Progress:
    """Prints ``[label  1.23s] line`` (seconds since ``t0``, a ``time.perf_counter()``
    value) to stderr: calling it prints an info line (a start-up stage), :meth:`debug` a
    detail (how the processes stop), :meth:`warning` an interrupt, :meth:`error` a fatal
    error; each only at ``log_level`` or a more verbose one."""

    def __init__(self, label: str, t0: float, log_level: str = "info") -> None:
        self.label, self.t0, self.log_level = label, t0, log_level

    def _print(self, level: str, line: str) -> None:
        if shows(self.log_level, level):
            elapsed = time.perf_counter() - self.t0
            print(f"[{self.label} {elapsed:6.2f}s] {line}", file=sys.stderr, flush=True)

    def __call__(self, line: str) -> None:
        self._print("info", line)

    def debug(self, line: str) -> None:
        self._print("debug", line)

    def warning(self, line: str) -> None:
        self._print("warning", line)

    def error(self, line: str) -> None:
        self._print("error", line)


def apply_log_level(log_level: str) -> None:
    """Below ``debug``: the environment variables that keep glog's INFO and WARNING lines
    (Paddle's ``I1207 ...``, Mooncake's) out of this process and of every child it starts
    (call it before Paddle or Mooncake is loaded: they read them once), and httpx's
    per-request lines (Python logging) at WARNING."""
    import logging

    if log_level != "debug":
        for name, value in _QUIET_NATIVE_LOGS.items():
            os.environ.setdefault(name, value)
    logging.getLogger("httpx").setLevel(logging.DEBUG if log_level == "debug" else logging.WARNING)


def import_paddle() -> None:
    """Import Paddle with SIGINT and SIGTERM held back until it is done: a Ctrl-C during the
    import would fail it half-way (Paddle prints its own error for that), and the import
    replaces the SIGTERM handler with Paddle's, which prints ``FatalError: Termination
    signal`` and aborts. The handlers there were before come back (so SIGTERM and SIGINT do
    what they did), then a signal that came during the import is delivered."""
    if "paddle" in sys.modules:
        return
    held = {signal.SIGINT, signal.SIGTERM}
    before = {sig: signal.getsignal(sig) for sig in held}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        import paddle  # noqa: F401

        for sig, handler in before.items():
            if handler is not None:  # (None: a handler not set from Python, left as it is)
                signal.signal(sig, handler)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def interruptible(say: Callable[[], None]) -> Iterator[None]:
    """While the block runs, the first SIGTERM or SIGINT calls ``say`` (the one line the user
    sees at once, before a clean-up that may take seconds) and raises ``KeyboardInterrupt``
    in the main thread; later ones are ignored, so the clean-up it unwinds through runs whole.
    The previous handlers come back when the block ends."""

    def interrupted(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        say()
        raise KeyboardInterrupt

    old = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
