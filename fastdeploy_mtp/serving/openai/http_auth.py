"""Who may call which endpoint of the HTTP app, and OpenAI-shaped answers for what FastAPI
and Starlette would otherwise answer in their own shape.

* ``/v1/splitwise/*`` (the hand-over endpoints of prefill and decode instances): only the
  router, which presents ``Authorization: Bearer <router token>``
  (:func:`fastdeploy_mtp.credentials.http_token` of the splitwise secret). The API key does
  not open them.
* Every other ``/v1/*`` endpoint: one of the API keys (:mod:`fastdeploy_mtp.tenancy`), when
  any is configured; the router token is accepted too, so that a router can read an
  instance's ``/v1/models``. Without API keys these endpoints are open. The tenant of the
  key presented goes to the endpoint in ``request.state.tenant`` (``None``: none, or the
  global prefix-cache scope), for the request's prefix-cache namespace.
* ``/metrics``: the metrics key, when one is configured (no API key opens it); else open.
* ``/health`` and ``/version``: open (they hold nothing a client sent). Any other path is
  answered 404 (FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` are not served).

A refused request is answered 401 in OpenAI's error shape and counted as
``fastdeploy:dropped_messages_total{channel="http"}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from ...credentials import DroppedMessages, matching_key
from ...tenancy import ClientKeys
from .protocol import APIError

SPLITWISE_PREFIX = "/v1/splitwise/"
logger = logging.getLogger(__name__)


@dataclass
class Access:
    """The credentials an app checks.

    Attributes:
        keys: the API keys of ``/v1/*`` (none: those endpoints are open), the metrics key and
            the prefix-cache scope.
        router_token: what the router presents on ``/v1/splitwise/*`` (``None``: an app
            without splitwise endpoints; a request there is answered as any unknown path).
        dropped: where refusals are counted (``None``: not counted).
    """

    keys: ClientKeys = field(default_factory=ClientKeys)
    router_token: bytes | None = None
    dropped: DroppedMessages | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # what every request is checked against, encoded and digested once
        self._api_keys = [key.encode() for key in self.keys.api_keys]
        self._tenants = [self.keys.tenant(i) for i in range(len(self._api_keys))]

    def keys_for(self, path: str) -> list[bytes] | None:
        """The credentials that open ``path`` (``None``: it is open). On ``/v1/*`` the API
        keys come first, in :attr:`ClientKeys.api_keys`' order."""
        if path.startswith(SPLITWISE_PREFIX):
            return None if self.router_token is None else [self.router_token]
        if path == "/metrics":
            return None if self.keys.metrics_key is None else [self.keys.metrics_key.encode()]
        if path == "/v1" or path.startswith("/v1/"):
            if not self.keys.api_keys:
                return None
            return self._api_keys + ([self.router_token] if self.router_token is not None else [])
        return None

    def tenant(self, path: str, index: int | None) -> bytes | None:
        """The tenant of a request to ``path`` that presented key ``index`` of
        :meth:`keys_for` (``None``: no key, the router's token, or the global scope)."""
        if path.startswith(SPLITWISE_PREFIX) or path == "/metrics":
            return None
        if index is None or index >= len(self._tenants):
            return None
        return self._tenants[index]


def _refusal(path: str) -> JSONResponse:
    if path.startswith(SPLITWISE_PREFIX):
        message = (
            "this endpoint is for the splitwise router: send `Authorization: Bearer <router "
            "token>` (the router derives it from the deployment's splitwise secret)"
        )
    elif path == "/metrics":
        message = "/metrics asks for the metrics key: send `Authorization: Bearer <key>`"
    else:
        message = "a valid API key is required: send `Authorization: Bearer <key>`"
    response = APIError(
        401, message, None, kind="invalid_request_error", code="invalid_api_key"
    ).response()
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


class Authorize:
    """The access check as plain ASGI middleware (not Starlette's ``BaseHTTPMiddleware``,
    which hides a client's disconnect from the endpoints behind it): a request without the
    credentials its path needs is answered 401 and counted; any other goes on unchanged."""

    def __init__(self, app: ASGIApp, access: Access):
        self.app, self.access = app, access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            keys = self.access.keys_for(path)
            index = None
            if keys is not None:
                index = matching_key(_header(scope, b"authorization"), keys)
                if index is None:
                    if self.access.dropped is not None:
                        self.access.dropped.add("http")
                    await _refusal(path)(scope, receive, send)
                    return
            scope.setdefault("state", {})["tenant"] = self.access.tenant(path, index)
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first ``name`` header of an ASGI request, as sent (``None``: absent)."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def install(app: FastAPI, access: Access) -> None:
    """Add the access check and the OpenAI-shaped error handlers to ``app``."""
    app.add_middleware(Authorize, access=access)
    app.exception_handler(StarletteHTTPException)(_http_error)
    app.exception_handler(Exception)(_unexpected_error)


async def _http_error(_: HTTPRequest, exc: StarletteHTTPException) -> Response:
    """404, 405 and the like, in OpenAI's error shape."""
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    response = APIError(exc.status_code, str(exc.detail), None, kind=kind).response()
    for name, value in (exc.headers or {}).items():  # e.g. Allow on a 405
        response.headers[name] = value
    return response


async def _unexpected_error(request: HTTPRequest, exc: Exception) -> Response:
    """A bug, answered 500 in OpenAI's error shape (and logged with its traceback)."""
    logger.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    message = f"internal error ({type(exc).__name__}); the server log has the details"
    return APIError(500, message, None, kind="server_error").response()
