"""The API's error responses in OpenAI's shape: ``{"error": {"message", "type", "param",
"code"}}`` with the HTTP status (:class:`APIError`)."""

from __future__ import annotations

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
