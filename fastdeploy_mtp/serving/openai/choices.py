"""The engine requests behind one OpenAI response: what the app serves (:class:`Served`), the
candidates a body asks for (``n``, ``best_of``: :func:`new_requests`, per-choice seeds), and
how their streams are started, collected, merged and cancelled together (one failing choice
or a client that goes away cancels every choice's request).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from fastapi import Request as HTTPRequest

from ...runtime.request import InvalidRequestError, Request
from ...runtime.sampling_params import StepDrafts, TokenLogprob, choice_seed
from ...tenancy import cache_namespace, check_salt
from ...tokenization import GenerationDefaults, Tokenizer
from ..engine_client.backend import Backend, Stream, stream_events
from .prompts import Prompt
from .protocol import (
    MAX_RESPONSE_REQUESTS,
    SAMPLING_FIELDS,
    APIError,
    ChatBody,
    CompletionBody,
    body_field,
    choice_counts,
    refuse_unsupported,
    sampling_params,
)
from .text import TextTracker

_T = TypeVar("_T")

#: seconds between checks that the client of a non-streaming request is still there
DISCONNECT_POLL_S = 0.25


@dataclass
class Served:
    """What the app serves: ``backend`` under the model id ``model_name``; ``tokenizer``
    makes prompts (a chat's through its chat template) and decodes responses; ``defaults``
    fill the sampling fields a request leaves out; ``eos_token_ids`` end a response unless
    the request sets ``ignore_eos``."""

    backend: Backend
    model_name: str
    tokenizer: Tokenizer
    created: int
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    eos_token_ids: list[int] = field(default_factory=list)

    def tracker(self) -> TextTracker:
        return TextTracker(self.tokenizer)


@dataclass
class Choices:
    """The engine requests of one response: ``requests[k]`` generates candidate ``k`` (its
    own request, batched with the others), ``per_prompt`` candidates for each prompt in
    order; ``n`` of each prompt's are returned, all of them unless ``best_of`` asked for
    more candidates; ``logprobs``: the client asked for logprobs (to rank ``best_of``
    candidates they are asked for internally, and not returned)."""

    requests: list[Request]
    n: int
    per_prompt: int
    logprobs: bool

    @property
    def prompts(self) -> int:
        return len(self.requests) // self.per_prompt

    def picked(self, results: list[Collected]) -> list[int]:
        """Which candidates are returned, in order (choice ``index`` ``i * n + j`` is prompt
        ``i``'s ``j``-th): all of them, or with ``best_of`` each prompt's ``n`` with the
        highest cumulative log-probability of their tokens, best first (a tie goes to the
        lower candidate index)."""
        if self.per_prompt == self.n:
            return list(range(len(results)))
        picked = []
        for start in range(0, len(results), self.per_prompt):
            group = range(start, start + self.per_prompt)
            ranked = sorted(group, key=lambda k: (-cumulative_logprob(results[k].entries), k))
            picked += ranked[: self.n]
        return picked


def new_requests(
    served: Served,
    prompts: list[Prompt],
    body: CompletionBody | ChatBody,
    prefix: str,
    fallback_max_tokens: int,
    tenant: bytes | None = None,
) -> Choices:
    """The engine requests ``body`` asks for: for each of ``prompts``, ``n`` (or ``best_of``)
    candidates, each checked by the backend (400/404 naming the field; a prompt's error names
    its :attr:`Prompt.field`). With a ``seed`` s, a prompt's candidate ``k`` samples with
    :func:`~fastdeploy_mtp.runtime.sampling_params.choice_seed` ``(s, k)`` (``s + k`` mod
    2**63), so each prompt's choices are those of a request of that prompt alone; without,
    each candidate's seed derives from its own request id (the first one's is the response
    id, candidate ``g`` of the response's that id with ``-g`` appended). The output limit is
    the body's, else the model's ``max_new_tokens``, else ``fallback_max_tokens``. Every
    request's prefix-cache namespace is :func:`~fastdeploy_mtp.tenancy.cache_namespace` of
    ``tenant`` (the API key's, :mod:`.http_auth`) and the body's ``cache_salt``."""
    chat = isinstance(body, ChatBody)
    if body.model not in (None, served.model_name):
        message = (
            f"model {body.model!r} is not served here (this server serves {served.model_name!r})"
        )
        raise APIError(404, message, "model")
    refuse_unsupported(body)
    problem = check_salt(body.cache_salt)
    if problem is not None:
        raise APIError(400, problem, "cache_salt")
    namespace = cache_namespace(tenant, body.cache_salt)
    n, best_of = choice_counts(body)
    if len(prompts) * best_of > MAX_RESPONSE_REQUESTS:
        message = (
            f"prompt: {len(prompts)} prompts x {best_of} choices each is "
            f"{len(prompts) * best_of} generations; one request may ask for at most "
            f"{MAX_RESPONSE_REQUESTS} (send several requests)"
        )
        raise APIError(400, message, "prompt")
    sampling = sampling_params(body, served.defaults, served.eos_token_ids)
    limit, limit_field = body.output_limit()
    max_tokens = limit or served.defaults.max_new_tokens or fallback_max_tokens
    for prompt in prompts:
        if not prompt.ids:
            raise APIError(400, f"{prompt.field}: the prompt is empty", prompt.field)
    asked = sampling.logprobs is not None
    if best_of > n and not asked:
        sampling.logprobs = 0  # the emitted tokens' own logprobs rank the candidates
    response_id = f"{prefix}-{uuid.uuid4().hex}"
    requests: list[Request] = []
    for prompt in prompts:
        for k in range(best_of):
            params = copy.deepcopy(sampling)
            if sampling.seed is not None:
                params.seed = choice_seed(sampling.seed, k)
            rid = f"{response_id}-{len(requests)}" if requests else response_id
            req = Request(
                rid,
                list(prompt.ids),
                max_tokens=max_tokens,
                sampling=params,
                cache_namespace=namespace,
            )
            requests.append(req)
            try:
                served.backend.validate(req)
            except InvalidRequestError as exc:
                if exc.field == "max_tokens":
                    param = limit_field
                elif exc.field in SAMPLING_FIELDS:
                    param = body_field(exc.field, chat)
                else:
                    param = prompt.field
                raise APIError(400, str(exc), param) from None
    return Choices(requests, n, best_of, asked)


def submit_all(served: Served, requests: list[Request]) -> list[Stream]:
    """Every request started on the backend; if one cannot be, those already started are
    cancelled before the error propagates."""
    streams: list[Stream] = []
    try:
        for req in requests:
            streams.append(served.backend.submit(req))
    except BaseException:
        cancel_all(served, streams)
        raise
    return streams


def cancel_all(served: Served, streams: list[Stream]) -> None:
    """Cancel every stream's request on the backend (a finished one is left as it is)."""
    for stream in streams:
        served.backend.cancel(stream.request)


Entries = list[tuple[int, TokenLogprob]]


class Collected(NamedTuple):
    """A whole response of one candidate: its text, finish reason, logprob entries (``None``
    when its request did not ask for logprobs) and draft logprobs (``None`` unless it asked
    for them: ``include_draft_logprobs``)."""

    text: str
    reason: str
    entries: Entries | None
    drafts: list[StepDrafts] | None = None


def cumulative_logprob(entries: Entries | None) -> float:
    """The sum of the log-probabilities of a candidate's tokens (``best_of`` ranks by it)."""
    return math.fsum(lp.logprob for _, lp in entries or [])


async def collect(served: Served, stream: Stream) -> Collected:
    """The whole response of ``stream``."""
    tracker = served.tracker()
    text, reason = "", "length"
    entries: Entries | None = None
    drafts: list[StepDrafts] | None = [] if stream.request.sampling.include_draft_logprobs else None
    async for kind, value in stream_events(served.backend, stream):
        if kind == "tokens":
            piece, got = tracker.feed_event(value)
            text += piece
            if got is not None:
                entries = (entries or []) + got
            if drafts is not None and value.drafts:
                drafts += value.drafts
        else:
            reason = value
    if stream.request.sampling.logprobs is not None and entries is None:
        entries = []
    return Collected(text + tracker.feed([], True), reason, entries, drafts)


async def collect_all(served: Served, streams: list[Stream]) -> list[Collected]:
    """Every stream's whole response, collected concurrently. If one fails (or this is
    cancelled), every request is cancelled before the error propagates."""
    tasks = [asyncio.ensure_future(collect(served, stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        cancel_all(served, streams)  # also those whose task was cancelled before it started
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def collect_or_abort(
    http: HTTPRequest, served: Served, streams: list[Stream]
) -> list[Collected]:
    """:func:`collect_all`, aborting every request if the client disconnects first (a
    non-streaming response has nothing to write until the end, so the disconnect is
    watched for)."""
    task = asyncio.ensure_future(collect_all(served, streams))
    while True:
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if done:
            return task.result()
        if await http.is_disconnected():
            task.cancel()  # collect_all cancels the requests on the backend
            with contextlib.suppress(asyncio.CancelledError, APIError):
                await task
            raise APIError(499, "the client disconnected; the request was aborted")


async def started(events: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[tuple[str, Any]]:
    """``events`` with its first item already awaited, so that an error before the first
    event (e.g. a splitwise instance's 400) is raised here, while the response can still
    carry its status, and not inside a started stream."""
    first = await anext(events)

    async def chained() -> AsyncIterator[tuple[str, Any]]:
        yield first
        async for item in events:
            yield item

    return chained()


async def started_all(
    served: Served, streams: list[Stream]
) -> list[AsyncIterator[tuple[str, Any]]]:
    """:func:`started` events of every stream (so an error before any choice's first event
    is still the response's status); on an error every request is cancelled."""
    try:
        return [await started(stream_events(served.backend, stream)) for stream in streams]
    except BaseException:
        cancel_all(served, streams)
        raise


async def merged(sources: list[AsyncIterator[_T]]) -> AsyncIterator[tuple[int, _T]]:
    """``(i, item)`` for the items of every ``sources[i]``, as they arrive (each source's in
    its order). An error of one source is raised at once; when the consumer stops early the
    pending reads are cancelled."""
    pending = {asyncio.ensure_future(anext(source)): i for i, source in enumerate(sources)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: pending[t]):
                i = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(sources[i]))] = i
                yield i, item
    finally:
        for task in pending:
            task.cancel()


def usage(requests: list[Request], prompts: int = 1) -> dict[str, int]:
    """OpenAI's usage of the returned choices' ``requests`` (those of each of ``prompts``
    prompts in turn, as many for each): each prompt counted once, the completion tokens
    summed over all of them."""
    per_prompt = len(requests) // prompts
    p = sum(len(r.prompt_token_ids) for r in requests[::per_prompt])
    c = sum(len(r.output_token_ids) for r in requests)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
