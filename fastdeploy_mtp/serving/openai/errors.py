"""The API's error responses in OpenAI's shape: ``{"error": {"message", "type", "param",
"code"}}`` with the HTTP status (:class:`APIError`), for every error, including those no
handler could answer (:class:`CancelledAsJSON`)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An OpenAI-style error response: HTTP ``status``, ``message``, the body field at fault
    (``param``), OpenAI's error ``type`` (``kind``) and ``code`` (default: the status; OpenAI
    names some errors, e.g. ``"invalid_api_key"``)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | int | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.code = status if code is None else code

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }
        return JSONResponse(body, status_code=self.status)


class CancelledAsJSON:
    """ASGI middleware: a request whose handler is cancelled before its response started --
    uvicorn cancels the requests still running when its graceful shutdown times out -- is
    answered 503 in OpenAI's shape (the server is shutting down), not with uvicorn's
    plain-text "500 Internal Server Error". (An exception a handler raises is
    :mod:`.http_auth`'s exception handler's: a 500 in OpenAI's shape.)"""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if started:
                raise
            error = APIError(503, "the server is shutting down", kind="server_error")
            await error.response()(scope, receive, send)  # answered: nothing is left to cancel
