"""A stand-in for the serving engine behind the OpenAI app, for tests that script its answers:
:class:`ScriptedBackend` records what the app submits and cancels; a subclass's ``submit``
says what each request's stream carries (``answer``)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.serving.engine_client.backend import Stream


class ScriptedBackend:
    """The backend surface ``create_app`` uses, with no engine: every request is accepted
    (``validate``), recorded in ``submitted`` and answered by :meth:`answer`; cancellations are
    recorded in ``cancelled``; the deployment is always healthy."""

    fatal = None

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.submitted: list[Request] = []
        self.cancelled: list[str] = []

    def validate(self, req: Request) -> None:
        pass

    def submit(self, req: Request) -> Stream:
        index = len(self.submitted)
        self.submitted.append(req)
        stream = Stream(req, asyncio.get_running_loop())
        self.answer(req, stream, index)
        return stream

    def answer(self, req: Request, stream: Stream, index: int) -> None:
        """Put what request number ``index`` (in submission order) gets on ``stream``."""
        raise NotImplementedError

    def cancel(self, req: Request) -> None:
        self.cancelled.append(req.request_id)

    async def health(self) -> str | None:
        return None
