"""How the engine takes requests out before they finish: one request (its client went
away, or its data cannot reach the model), every request, or every one holding a slot (an
error inside a shared step). Mixed into :class:`~.engine.Engine`."""

from __future__ import annotations

from .collaborators import Runner
from .request import InvalidRequestError, Request
from .scheduler import Scheduler


class Aborts:
    """The abort methods of :class:`~.engine.Engine`, over its scheduler and runner: the
    bookkeeping (slot, KV blocks, ``req.error``) always completes first, so the engine is
    left empty and usable even if resetting a slot's buffers fails."""

    scheduler: Scheduler
    runner: Runner

    def abort(self, req: Request, error: BaseException) -> bool:
        """Abort one queued or running request (e.g. its client went away): its slot and
        blocks are freed and ``req.error`` is set. Returns False if it had already finished."""
        if req.finished or not req.submitted:
            return False
        self._abort(req, error, {})
        return True

    def abort_all(self, error: BaseException) -> list[tuple[Request, BaseException]]:
        """Abort every queued and running request with ``error``; returns them."""
        failures: dict[str, BaseException] = {}
        reqs = [s.request for _, s in sorted(self.scheduler.slots.items())] + list(
            self.scheduler.waiting
        )
        self._abort_all(error, failures, running_only=False)
        return [(r, failures[r.request_id]) for r in reqs if r.request_id in failures]

    def _abort(
        self, req: Request, error: BaseException, failures: dict[str, BaseException]
    ) -> None:
        """Abort one request: reset its slot (if it holds one), free its blocks, record why."""
        holds_slot = (
            req.idx in self.scheduler.slots and self.scheduler.slots[req.idx].request is req
        )
        # bookkeeping first: the engine is empty even if a reset fails
        self.scheduler.abort(req, error)
        failures[req.request_id] = error
        if holds_slot:
            self.runner.abort_slot(req)

    def _abort_all(
        self, error: BaseException, failures: dict[str, BaseException], running_only: bool
    ) -> None:
        """Abort every request holding a slot (and, unless ``running_only``, every queued
        one)."""
        for _, state in sorted(self.scheduler.slots.items()):
            self._abort(state.request, error, failures)
        if not running_only:
            for req in list(self.scheduler.waiting):
                self._abort(req, error, failures)

    def _drop_invalid_tasks(
        self, tasks: list[Request], failures: dict[str, BaseException]
    ) -> list[Request]:
        """Abort the tasks whose data cannot reach the model (see
        :meth:`~fastdeploy_mtp.runtime.target_runner.TargetRunner.check_task`); keep the rest."""
        kept = []
        for req in tasks:
            try:
                self.runner.check_task(req)
            except InvalidRequestError as exc:
                self._abort(req, exc, failures)
                continue
            kept.append(req)
        return kept
