"""How worker rank 0 hands each step's emitted tokens to the engine (``serve
--token-channel``): the interface both channels implement, and their errors.

Two channels behind one interface: a :class:`TokenWriter` in rank 0 (``send`` after each
step, before the ``done`` reply) and a :class:`TokenReader` in the engine (``read`` once
that reply arrived). Both carry, per step, ``accept_tokens [N, K+1] int64`` (the tokens
slot ``b`` emitted are ``accept_tokens[b, :accept_num[b]]``) and ``accept_num [N] int64``
(0 for a slot still prefilling its prompt, or without a request).

The channels: ``shm`` (default, :mod:`.shm`: a private shared-memory segment) and ``sysv``
(:mod:`.sysv`: FastDeploy's SysV message); :mod:`.channel` opens a deployment's ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from ...runtime.target_runner import StepOutput

#: the ``--token-channel`` choices; the first is the default
TOKEN_CHANNELS = ("shm", "sysv")


class WorkerDiedError(RuntimeError):
    """A worker or the cache manager exited (or stopped answering); the deployment is gone."""


class WorkerStepError(RuntimeError):
    """A worker reported an exception in a step (the step's requests are aborted)."""


class TokenChannelError(OSError):
    """The shm token segment cannot be created or attached (the message names it and why; the
    command reports it in one line, exit status 1)."""


class TokenReader(Protocol):
    """The engine's end of a channel."""

    def read(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Step ``step``'s ``(accept_tokens [N, K+1] int64, accept_num [N] int64)``, once rank 0
        said ``done`` for it."""
        ...

    def drain(self) -> None:
        """Drop what a failed step may have left in the channel."""
        ...

    def close(self) -> None:
        """Release (and for the shm channel, remove) the channel."""
        ...


class TokenWriter(Protocol):
    """Rank 0's end of a channel."""

    def send(self, out: StepOutput, inputs: Any, step: int) -> None:
        """Send what step ``step`` emitted (``out``; ``inputs``: the target's buffers)."""
        ...

    def close(self) -> None: ...
