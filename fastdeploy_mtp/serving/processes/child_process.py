"""Set-up of a process the engine launches (the cache manager, each worker): how it stops
(SIGTERM unwinds, SIGINT is ignored from its first instruction, the parent's death stops it)
so that shared memory is always released and a terminal's Ctrl-C prints nothing of theirs."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import warnings
from collections.abc import Iterator

from .start_up import import_paddle


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """While the block runs (the engine starting a child), SIGINT is blocked in this thread,
    and a child started here inherits the block: its Python start-up and imports cannot be
    interrupted (no ``KeyboardInterrupt`` traceback of its own) until
    :func:`become_child_process` ignores SIGINT and unblocks it. A SIGINT that comes to this
    process meanwhile is delivered when the block ends."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class Terminated(SystemExit):
    """Raised in a child process by SIGTERM (from the engine, or from the kernel when the
    parent died): unwinds ``finally`` blocks so shared memory is released."""


def _on_term(signum: int, frame: object) -> None:
    raise Terminated(0)


def install_stop_handlers() -> None:
    """SIGTERM unwinds (:class:`Terminated`); SIGINT is ignored. Paddle installs its own
    fatal-signal handlers when it is imported (they abort the process, skipping every
    ``finally``, so shared memory would leak): call this after importing Paddle. Children
    call it once more after their Paddle set-up (model, caches), a cheap guard should a later
    initialisation install Paddle's again."""
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def become_child_process(parent_death_signal: bool = True) -> None:
    """Set up a process the engine launched (under :func:`sigint_held`): SIGINT is ignored
    (a terminal's Ctrl-C reaches the whole process group; the engine decides how its
    children stop), Paddle imported (see :func:`install_stop_handlers`), SIGTERM unwinds, and on
    Linux the kernel sends SIGTERM if the parent dies first (unless ``parent_death_signal``
    is false: the cache manager watches its parent itself, see
    :mod:`fastdeploy_mtp.serving.processes.cache_manager`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a SIGINT held since the start is dropped)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    warnings.filterwarnings("ignore", message="No ccache found")  # Paddle's import-time notice
    import_paddle()  # a SIGTERM during the import kills the process after it, silently
    install_stop_handlers()  # (Paddle's handlers first, ours over them)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM if parent_death_signal else 0, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        raise Terminated(1)
