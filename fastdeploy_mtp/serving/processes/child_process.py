"""Set-up of a process the engine launches (the cache manager, each worker): how it stops
(SIGTERM unwinds, SIGINT is ignored, the parent's death stops it) so that shared memory is
always released."""

from __future__ import annotations

import ctypes
import os
import signal
import warnings


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
    """Set up a process the engine launched: Paddle imported (see
    :func:`install_stop_handlers`), SIGTERM unwinds, SIGINT is ignored (a terminal's Ctrl-C
    reaches the whole process group; the engine decides how its children stop), and on
    Linux the kernel sends SIGTERM if the parent dies first (unless ``parent_death_signal``
    is false: the cache manager watches its parent itself, see
    :mod:`fastdeploy_mtp.serving.processes.cache_manager`)."""
    warnings.filterwarnings("ignore", message="No ccache found")  # Paddle's import-time notice
    import paddle  # noqa: F401  (its handlers first, ours over them)

    install_stop_handlers()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM if parent_death_signal else 0, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() == 1:  # the parent died before prctl took effect
        raise Terminated(1)
