"""``fastdeploy-mtp router``: the OpenAI front end of splitwise (disaggregated) serving.

Each request goes to a prefill instance (``serve --splitwise-role prefill``), which computes
the prompt's KV cache and the first token(s), then to a decode instance
(``serve --splitwise-role decode``), which generates the rest; the client sees one OpenAI
response, streamed or not, exactly as from ``serve`` (the formatting is
:func:`~fastdeploy_mtp.serving.openai.app.create_app`'s; :class:`~.routing.RouterBackend` is its
backend).

What the router says to the instances (JSON over HTTP, the bodies
:mod:`fastdeploy_mtp.serving.messages.router_instances`' classes, each request and 200 answer with
the protocol version in the ``X-FastDeploy-MTP-Protocol`` header; an instance refuses another
version with a 400, the router an answer of another version with a 502, each naming both):

* ``POST /v1/splitwise/prefill`` ``{"request_id", "prompt_token_ids", "max_tokens",
  "sampling"}`` -> ``{"request_id", "output_token_ids", "output_logprobs", "finished",
  "finish_reason", "handoff"}``; the first tokens go to the client at once; ``handoff``
  (opaque, ``null`` iff finished) is passed on unchanged.
* ``POST /v1/splitwise/decode`` ``{"request_id", "prompt_token_ids", "output_token_ids",
  "max_tokens", "sampling", "handoff"}`` -> server-sent events ``{"token_ids": [...],
  "logprobs": [...]}`` (``logprobs`` only when the request asked for them), then
  ``{"finish_reason": ...}``, then ``[DONE]`` (``{"error": {...}}`` if it fails mid-stream).
  A 429 means the instance is full: the router waits (``Retry-After``, at most 1 s a time)
  and tries the next decode instance, until the queue timeout; the request is never dropped
  before that. Closing the stream aborts the request on the instance (the router does so
  when its client disconnects).
* ``GET /health`` and ``GET /v1/models`` on both.

``sampling`` is the request's :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams` as
``to_dict()``, built from the OpenAI body exactly as ``serve`` does
(:func:`~fastdeploy_mtp.serving.openai.protocol.sampling_params`, in
:func:`~fastdeploy_mtp.serving.openai.app.create_app`); logprobs travel as ``{"token_id", "logprob",
"top": [[id, logprob], ...]}`` per token.

Instances are taken round-robin, prefill and decode separately. A 400 from an instance (the
request is invalid) reaches the client as that 400; an unreachable instance is a 502, an
instance answering 503 a 503, any other failure a 502, each naming the instance's URL.
``/health`` is 200 while at least one prefill and one decode instance answer theirs.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI

from ...credentials import splitwise_secret
from ...engine_args import UsageError
from ...tenancy import options_keys
from ...tokenization import GenerationDefaults, Tokenizer, load_generation_config, load_tokenizer
from ..openai.app import create_app
from ..openai.http_auth import Access
from ..openai.http_server import bind_listener, run_http
from ..processes.start_up import Progress, apply_log_level, interruptible, process_started
from .forwarding import HEALTH_TIMEOUT_S, Instances
from .options import RouterOptions
from .routing import RouterBackend


# ---- the command ---------------------------------------------------------------------------
def router_app(
    backend: RouterBackend,
    model_name: str,
    tokenizer: Tokenizer | None = None,
    defaults: GenerationDefaults | None = None,
    access: Access | None = None,
) -> FastAPI:
    """The OpenAI app over ``backend`` with the served model's ``tokenizer`` (the instances'
    model folder's, so prompts and texts are what ``serve`` makes of them; ``None``: the
    shipped model's) and generation ``defaults``; its shutdown ends the requests in flight
    and closes the backend's HTTP client. ``access``: who may call it
    (:mod:`fastdeploy_mtp.serving.openai.http_auth`)."""
    from ...models.folder_inspection import ASSETS_DIR

    app = create_app(
        backend, model_name, tokenizer or load_tokenizer(ASSETS_DIR), defaults, access=access
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await backend.aclose()

    app.router.lifespan_context = lifespan
    return app


def wait_for_instances(
    urls: Sequence[tuple[str, str]], timeout: float, progress: Callable[[str], None]
) -> None:
    """Poll each ``(role, url)``'s ``/health`` until it answers 200, reporting each one ready.

    Raises:
        TimeoutError: some instance was not healthy within ``timeout`` seconds (names them).
    """
    deadline = time.monotonic() + timeout
    waiting = dict.fromkeys(urls, "not asked yet")
    with httpx.Client(timeout=HEALTH_TIMEOUT_S) as client:
        while waiting:
            for role, url in list(waiting):
                try:
                    status = client.get(url + "/health").status_code
                    waiting[(role, url)] = f"/health answered {status}"
                except httpx.HTTPError as exc:
                    status, waiting[(role, url)] = 0, f"unreachable ({type(exc).__name__})"
                if status == 200:
                    del waiting[(role, url)]
                    progress(f"{role} instance {url} healthy")
            if not waiting:
                return
            if time.monotonic() >= deadline:
                left = ", ".join(
                    f"{role} instance {url} ({why})" for (role, url), why in waiting.items()
                )
                raise TimeoutError(f"not healthy after --start-timeout {timeout:g} s: {left}")
            # a plain poll rather than tenacity: every instance is asked each round and each
            # one that answers is reported at once, which a retry around one call does not give
            time.sleep(0.2)


def fetch_model_name(url: str, headers: dict[str, str] | None = None) -> str:
    """``data[0].id`` of the instance's ``/v1/models`` (asked with ``headers``)."""
    try:
        r = httpx.get(url + "/v1/models", timeout=HEALTH_TIMEOUT_S, headers=headers)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConnectionError(
            f"could not read the served model name from {url}/v1/models: {exc}"
        ) from None


def run_router(opts: RouterOptions) -> int:
    """Wait for the instances, then route until SIGTERM (returns 0) or SIGINT (130; 1 if the
    server could not start)."""

    from ...models.folder_inspection import ASSETS_DIR

    t0 = process_started()  # the ready line counts from here
    progress = Progress("router", t0, opts.log_level)
    apply_log_level(opts.log_level)
    folder = opts.tokenizer or ASSETS_DIR
    # before any wait: a bad tokenizer folder fails fast
    try:
        tokenizer, defaults = load_tokenizer(folder), load_generation_config(folder)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--tokenizer {folder}: {exc}") from None
    keys = options_keys(opts)
    secret = splitwise_secret(opts.splitwise_secret_file)
    # checks the URLs first
    backend = RouterBackend(
        Instances(opts.prefill, opts.decode, opts.queue_timeout, secret, opts.instance_timeout)
    )
    listener = bind_listener(opts.host, opts.port)  # a taken port is refused before any wait
    try:
        # during start-up: stop waiting
        with interruptible(lambda: progress.warning("interrupted during start-up")):
            progress(
                f"waiting for {len(backend.prefill)} prefill and {len(backend.decode)} decode "
                f"instance(s) (at most {opts.start_timeout:g} s)"
            )
            wait_for_instances(
                [("prefill", u) for u in backend.prefill] + [("decode", u) for u in backend.decode],
                opts.start_timeout,
                progress,
            )
            model_name = opts.served_model_name or fetch_model_name(
                backend.prefill[0], backend.headers
            )
            progress(
                f"serving model {model_name!r}; decode queue timeout {opts.queue_timeout:g} s, "
                f"instance timeout {opts.instance_timeout:g} s"
            )
            access = Access(keys, None, backend.dropped)
            app = router_app(backend, model_name, tokenizer, defaults, access)
            return run_http(app, opts.host, opts.port, progress, t0, sock=listener)
    except KeyboardInterrupt:
        return 130
    finally:
        listener.close()
