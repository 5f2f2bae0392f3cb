"""The OpenAI-compatible HTTP app (FastAPI) over a
:class:`~fastdeploy_mtp.serving.engine_client.backend.Backend`.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``:
server-sent events ending in ``data: [DONE]``, see :mod:`.streaming`), ``GET /v1/models``,
``GET /health`` (200, or 503 with the backend's reason: for ``serve``, once the deployment
lost a process), ``GET /metrics`` (Prometheus text; see :mod:`fastdeploy_mtp.serving.metrics`),
``GET /version`` (``{"version": ...}``, the package's, as vLLM's).
The request bodies and sampling fields are :mod:`.protocol`'s; a completion's prompts
:mod:`.prompts`' (a list of prompts gives ``n`` choices each, choice ``index`` ``i * n + j``
being prompt ``i``'s ``j``-th, as OpenAI numbers them). Every error is OpenAI-shaped
(:mod:`.errors`), a body that is not JSON included (its message names line and column).
``finish_reason`` is the engine's (``"stop"``: EOS, a stop token id or a stop string, which
the text does not include; ``"length"``).

The engine requests behind one response (``n`` choices, ``best_of`` candidates) are
started, collected and cancelled together by :mod:`.choices`. The backend is the engine loop
for ``serve`` (:class:`~fastdeploy_mtp.serving.engine_client.engine_loop.AsyncEngine`) or the
splitwise router (:class:`~fastdeploy_mtp.serving.router.routing.RouterBackend`).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from ... import __version__
from ...tokenization import GenerationDefaults, Tokenizer
from ..engine_client.backend import Backend
from ..metrics.families import render
from .choices import (
    Served,
    collect_or_abort,
    new_requests,
    started_all,
    submit_all,
    usage,
)
from .errors import CancelledAsJSON
from .http_auth import Access, install
from .prompts import Prompt, completion_prompts
from .protocol import (
    APIError,
    ChatBody,
    CompletionBody,
    RequestBody,
    chat_prompt,
    refuse_invalid_text,
)
from .streaming import ChatChunks, CompletionChunks, completion_choice, sse, stream_chunks


def create_app(
    backend: Backend,
    model_name: str,
    tokenizer: Tokenizer,
    defaults: GenerationDefaults | None = None,
    eos_token_ids: list[int] | None = None,
    access: Access | None = None,
) -> FastAPI:
    """The FastAPI app over ``backend`` (an
    :class:`~fastdeploy_mtp.serving.engine_client.engine_loop.AsyncEngine`, or any other
    :class:`~fastdeploy_mtp.serving.engine_client.backend.Backend`); see
    :class:`Served` for the other arguments.
    ``eos_token_ids`` defaults to the tokenizer's EOS id and ``defaults``' ids; ``access``
    says who may call which endpoint (:mod:`.http_auth`; default: everyone)."""
    defaults = defaults or GenerationDefaults()
    if eos_token_ids is None:
        eos_token_ids = list(dict.fromkeys([*tokenizer.eos_token_ids, *defaults.eos_token_ids]))
    app = FastAPI(  # no /docs, /redoc, /openapi.json: the API is OpenAI's, see docs/openai_api.md
        title="fastdeploy-mtp",
        description="OpenAI-compatible server with MTP speculative decoding",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.served = Served(
        backend, model_name, tokenizer, int(time.time()), defaults, list(eos_token_ids)
    )
    install(app, access or Access())
    app.exception_handler(APIError)(_api_error)
    app.exception_handler(RequestValidationError)(_validation_error)
    app.add_middleware(CancelledAsJSON)  # outside the access check: sees every request
    app.get("/health")(health)
    app.get("/version")(version)
    app.get("/metrics")(metrics)
    app.get("/v1/models")(models)
    app.post("/v1/completions")(completions)
    app.post("/v1/chat/completions")(chat)
    return app


def served_by(request: HTTPRequest) -> Served:
    """The :class:`Served` of the app answering ``request`` (a FastAPI dependency)."""
    served = request.app.state.served
    assert isinstance(served, Served)
    return served


#: A handler's :class:`Served` (FastAPI injects it).
ServedDep = Annotated[Served, Depends(served_by)]


async def _api_error(_: HTTPRequest, exc: APIError) -> JSONResponse:
    return exc.response()


async def _validation_error(http: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return APIError(400, await _json_error(http, first)).response()
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if param is None:  # the body as a whole: absent, or not a JSON object
        message = "the request body must be a JSON object (Content-Type: application/json)"
        return APIError(400, message).response()
    return APIError(400, f"{param}: {first.get('msg', 'invalid value')}", param).response()


async def _json_error(http: HTTPRequest, error: dict[str, Any]) -> str:
    """The message of a body that is not valid JSON: the parser's reason and where (line and
    column of the body, both from 1)."""
    reason = (error.get("ctx") or {}).get("error", "JSON decode error")
    position = [p for p in error.get("loc", ()) if isinstance(p, int)]
    if not position:
        return f"request body is not valid JSON: {reason}"
    text = (await http.body()).decode("utf-8", errors="replace")
    at = min(position[0], len(text))
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    return f"request body is not valid JSON: {reason} at line {line}, column {column}"


async def health(served: ServedDep) -> Response:
    reason = await served.backend.health()
    if reason:
        return JSONResponse({"status": "unhealthy", "reason": reason}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(served: ServedDep) -> Response:
    return Response(
        render(served.backend.registry), media_type="text/plain; version=0.0.4; charset=utf-8"
    )


async def version() -> dict[str, str]:
    return {"version": __version__}


async def models(served: ServedDep) -> dict[str, Any]:
    card = {
        "id": served.model_name,
        "object": "model",
        "created": served.created,
        "owned_by": "fastdeploy-mtp",
    }
    return {"object": "list", "data": [card]}


def tenant_of(http: HTTPRequest) -> bytes | None:
    """The tenant the access check found for ``http`` (:mod:`.http_auth`; ``None``: none)."""
    tenant = getattr(http.state, "tenant", None)
    return tenant if isinstance(tenant, bytes) else None


def include_usage(body: RequestBody) -> bool:
    return bool(body.stream_options and body.stream_options.get("include_usage"))


async def completions(body: CompletionBody, served: ServedDep, http: HTTPRequest) -> Any:
    refuse_invalid_text(body.model_dump())
    prompts = completion_prompts(body.prompt, served.tokenizer)
    choices = new_requests(served, prompts, body, "cmpl", 16, tenant_of(http))
    streams = submit_all(served, choices.requests)
    base = {
        "id": choices.requests[0].request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": served.model_name,
    }
    if not body.stream:
        results = await collect_or_abort(http, served, streams)
        picked = choices.picked(results)
        returned = [
            completion_choice(served.tracker(), i, *results[k], logprobs=choices.logprobs)
            for i, k in enumerate(picked)
        ]
        counted = usage([choices.requests[k] for k in picked], choices.prompts)
        return {**base, "choices": returned, "usage": counted}
    events = await started_all(served, streams)
    shape = CompletionChunks(choices.logprobs)
    chunks = stream_chunks(
        served, streams, events, base, shape, include_usage(body), choices.prompts
    )
    return sse(chunks)


async def chat(body: ChatBody, served: ServedDep, http: HTTPRequest) -> Any:
    refuse_invalid_text(body.model_dump())
    if not body.messages:
        raise APIError(400, "messages must not be empty", "messages")
    prompt = chat_prompt(served.tokenizer, [m.model_dump() for m in body.messages])
    # the template wrote the special tokens the model expects; none are added again
    ids = served.tokenizer.encode(prompt, add_special_tokens=False)
    choices = new_requests(served, [Prompt(ids, "messages")], body, "chatcmpl", 64, tenant_of(http))
    streams = submit_all(served, choices.requests)
    base = {
        "id": choices.requests[0].request_id,
        "created": int(time.time()),
        "model": served.model_name,
    }
    if not body.stream:
        results = await collect_or_abort(http, served, streams)
        returned = []
        for i, (text, reason, entries, drafts) in enumerate(results):
            tracker = served.tracker()
            logprobs = None if entries is None else tracker.chat_logprobs(entries)
            message = {"role": "assistant", "content": text}
            one = {"index": i, "message": message, "finish_reason": reason, "logprobs": logprobs}
            if drafts is not None:
                one["draft_logprobs"] = tracker.draft_logprobs(drafts)
            returned.append(one)
        return {
            **base,
            "object": "chat.completion",
            "choices": returned,
            "usage": usage(choices.requests),
        }
    events = await started_all(served, streams)
    head = {**base, "object": "chat.completion.chunk"}
    return sse(stream_chunks(served, streams, events, head, ChatChunks(), include_usage(body)))
