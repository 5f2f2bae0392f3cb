"""The engine loop of a splitwise instance (``serve --splitwise-role prefill|decode``):
:class:`SplitwiseEngine` is the
:class:`~fastdeploy_mtp.serving.engine_client.engine_loop.AsyncEngine` that hands a prefill
instance's requests over once their first token is out (their KV blocks offered by its
:class:`~fastdeploy_mtp.splitwise.kv_source.KVSource`, the hand-over signed), and that checks a
decode instance's hand-overs and pulls their KV blocks in a thread. The HTTP side is
:mod:`.endpoints`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ...credentials import DroppedMessages
from ...runtime.engine import Engine
from ...runtime.events import StepEvents
from ...runtime.request import InvalidRequestError, Request
from ..engine_client.backend import Stream
from ..engine_client.engine_loop import AsyncEngine
from ..messages.router_instances import DecodeRequest, HandoffMessage
from ..openai.protocol import APIError
from ..openai.text import emitted_of


class SplitwiseEngine(AsyncEngine):
    """:class:`AsyncEngine` of a prefill or decode instance.

    Args:
        engine: the engine (``scheduler_config.splitwise_role`` is ``"prefill"`` or ``"decode"``).
        on_fatal: see :class:`AsyncEngine`.
        kv_source: prefill: offers handed-off requests' blocks
            (:class:`~fastdeploy_mtp.splitwise.kv_source.KVSource`); its ``on_release``
            must be :meth:`released`.
        layout: decode: this instance's KV layout (checked against each descriptor).
        caches: decode: every rank's caches as writable numpy views (the pull's target).
        transport: decode: ``"shm"``, ``"mooncake"``, ``"tcp"`` or ``"auto"`` (per request: shared
            memory when the prefill instance's cache names exist on this host, else the Mooncake
            transfer engine when the prefill instance offers it, else tcp).
        transfer_timeout: decode: seconds a KV transfer may take.
        max_waiting: decode: handed-over requests that may wait for a slot before new ones get 429.
        dropped: the deployment's count of refused messages.
        secret: the splitwise secret (:func:`fastdeploy_mtp.credentials.splitwise_secret`):
            the router's credential on ``/v1/splitwise/*``, the hand-over signature's key.
    """

    def __init__(
        self,
        engine: Engine,
        on_fatal: Callable[[str], None],
        kv_source: Any = None,
        layout: Any = None,
        caches: list[list[Any]] | None = None,
        transport: str = "auto",
        transfer_timeout: float = 60.0,
        max_waiting: int = 8,
        dropped: DroppedMessages | None = None,
        secret: bytes | None = None,
    ):
        from ...splitwise.transport import AUTO, transport_names

        if transport not in (AUTO, *transport_names()):
            raise ValueError(
                f"--kv-transport must be one of {(AUTO, *transport_names())}, got {transport!r}"
            )
        self.role = engine.role
        self.kv_source = kv_source
        self.layout = layout
        self.caches = caches
        self.transport = transport
        self.transfer_timeout = transfer_timeout
        self.max_waiting = max_waiting
        self._released: queue.Queue[str] = queue.Queue()
        self._transfers_done: queue.Queue[tuple[Request, BaseException | None]] = queue.Queue()
        self._descriptors: dict[str, tuple[Request, dict[str, Any]]] = {}
        self._pending = 0  # decode: submitted, not yet admitted to the engine's queue
        if self.role == "decode":
            engine.kv_fetcher = self._fetch
        self.secret = secret
        super().__init__(engine, on_fatal, dropped)

    def _secret(self) -> bytes:
        if self.secret is None:
            raise RuntimeError("a splitwise instance needs the splitwise secret")
        return self.secret

    # ---- the OpenAI endpoints are the router's --------------------------------------------
    def validate(self, req: Request) -> None:
        raise APIError(
            400,
            f"this is a splitwise {self.role} instance: send requests to the router "
            "(`fastdeploy-mtp router`)",
            kind="invalid_request_error",
        )

    def check(self, req: Request) -> None:
        """Submission checks of a ``/v1/splitwise/*`` request (400 naming the field)."""
        try:
            self.engine.scheduler.validate(req)
            if req.handoff_state is not None:
                self.engine.runner.check_handoff(req.handoff_state)
        except (InvalidRequestError, ValueError) as exc:
            raise APIError(400, str(exc), getattr(exc, "field", "handoff")) from None

    # ---- prefill ---------------------------------------------------------------------------
    def released(self, request_id: str, reason: str) -> None:
        """``KVSource``'s ``on_release``: the blocks of ``request_id`` may be reused."""
        self._released.put(request_id)

    def _after_step(self, events: StepEvents) -> None:
        for h in events.handed_off:
            rid = h.request.request_id
            stream = self._streams.pop(rid, None)
            if stream is None:  # its client left meanwhile: nobody will fetch the blocks
                self.engine.release_handoff(rid)
                continue
            try:
                descriptor = self.kv_source.offer(rid, h.blocks)
            except Exception as exc:  # e.g. the KV source is closing: fail this request only
                self.engine.release_handoff(rid)
                with self.counters.lock:
                    self.counters.failure += 1
                stream.put(
                    "error",
                    APIError(500, f"cannot offer the KV blocks: {exc}", kind="server_error"),
                )
                continue
            from ...splitwise.handoff import sign_handoff

            outputs = list(h.request.output_token_ids)
            signature = sign_handoff(
                self._secret(), rid, h.request.prompt_token_ids, outputs, h.state, descriptor
            )
            with self.counters.lock:  # (counted before its client hears of it)
                self.counters.success += 1
            stream.put("tokens", emitted_of(h.request, outputs))
            stream.put("handoff", HandoffMessage(state=h.state, kv=descriptor, signature=signature))

    def _before_step(self) -> None:
        while True:
            try:
                self.engine.release_handoff(self._released.get_nowait())
            except queue.Empty:
                break
        while True:
            try:
                req, error = self._transfers_done.get_nowait()
            except queue.Empty:
                break
            aborted_before = req.finished
            self.engine.transfer_done(req, error)
            if error is not None and not aborted_before:
                with self.counters.lock:
                    self.counters.failure += 1
                stream = self._streams.pop(req.request_id, None)
                if stream is not None:
                    stream.put(
                        "error", APIError(502, f"KV transfer failed: {error}", kind="server_error")
                    )
        if self._descriptors:  # forget those of requests aborted before they got a slot
            self._descriptors = {k: v for k, v in self._descriptors.items() if not v[0].finished}

    # ---- decode ----------------------------------------------------------------------------
    def full(self) -> bool:
        """Too many handed-over requests wait for a slot (answer 429)."""
        return len(self.engine.scheduler.waiting) + self._inbox.qsize() >= self.max_waiting

    def check_signature(self, body: DecodeRequest, handoff: HandoffMessage) -> None:
        """A 400 (counted as a dropped hand-over) unless a prefill instance holding this
        deployment's splitwise secret signed this hand-over for this request, prompt and
        first tokens."""
        from ...splitwise.handoff import handoff_signature_matches

        if not handoff_signature_matches(
            self._secret(),
            handoff.signature,
            body.request_id,
            body.prompt_token_ids,
            body.output_token_ids,
            handoff.state,
            handoff.kv,
        ):
            self.dropped.add("handoff")
            raise APIError(
                400,
                "handoff: the signature does not match: not made by a prefill instance with this "
                "deployment's splitwise secret for this request id, prompt and first tokens, or "
                "changed on the way",
                "handoff",
            )

    def check_history(self, req: Request, handoff: HandoffMessage) -> None:
        """A 400 (counted) unless the slot state is this request's just after its prompt and
        the offered blocks hold every cached position
        (:func:`~fastdeploy_mtp.splitwise.handoff.check_handoff_history`)."""
        from ...splitwise.handoff import HandoffError, check_handoff_history

        block_ids = handoff.kv.get("block_ids")
        spec = self.engine.fd_config.speculative_config
        try:
            check_handoff_history(
                handoff.state,
                req.prompt_token_ids,
                req.output_token_ids,
                len(block_ids) if isinstance(block_ids, list) else 0,
                self.engine.fd_config.cache_config.block_size,
                spec.num_speculative_tokens if spec.enabled else 0,
            )
        except HandoffError as exc:
            self.dropped.add("handoff")
            raise APIError(400, f"handoff: {exc}", "handoff") from None

    def submit_transferred(self, req: Request, descriptor: dict[str, Any]) -> Stream:
        self._descriptors[req.request_id] = (req, descriptor)
        return self.submit(req)

    def _fetch(self, req: Request, blocks: list[int]) -> None:
        """The engine's ``kv_fetcher``: pull ``req``'s blocks in a thread (all but the leading
        ones this instance's prefix cache already gave it: ``req.num_cached_tokens``)."""
        from ...splitwise.kv_client import pull_blocks
        from ...splitwise.transport import choose_transport

        _, descriptor = self._descriptors.pop(req.request_id)
        transport = choose_transport(self.transport, descriptor)
        caches = self.caches
        if caches is None:
            raise RuntimeError("a decode instance needs its caches to receive KV blocks")
        skip = req.num_cached_tokens // self.engine.fd_config.cache_config.block_size

        def pull() -> None:
            error: BaseException | None = None
            nbytes: int | None = None
            t0 = time.perf_counter()
            try:
                nbytes = pull_blocks(
                    descriptor,
                    caches,
                    self.layout,
                    blocks,
                    transport,
                    self.transfer_timeout,
                    self.secret,
                    skip,
                    self.dropped,
                )
            except Exception as exc:
                error = exc
            self.counters.count_transfer(transport, nbytes, time.perf_counter() - t0)
            self._transfers_done.put((req, error))

        threading.Thread(target=pull, name=f"kv-pull-{req.request_id}", daemon=True).start()
