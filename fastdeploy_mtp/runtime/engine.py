"""The reference engine's generation loop: submission, the step (schedule, target step and
proposer round, hand-out of the emitted tokens), aborts, and the splitwise hand-over of a
request between a prefill and a decode instance.

What a step reports is in :mod:`.events`, the speculation statistics in
:mod:`.engine_metrics`, where an output stops early in :mod:`.stops`. The engine is built with
its collaborators (:mod:`.collaborators`) by :mod:`fastdeploy_mtp.assembly`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from ..config import FDConfig
from .collaborators import Runner, SlotHandover
from .engine_aborts import Aborts
from .engine_metrics import Metrics
from .events import HandedOffRequest, StepEvents
from .handover_checks import check_transferred
from .request import GenerationError, Request, RequestType
from .sampling_params import TokenLogprob
from .scheduler import Scheduler
from .step_output import StepOutput
from .stops import (
    Detokenize,
    append_output,
    check_stop_strings,
    finish_reason,
    safe_to_emit,
)


class Engine(Aborts):
    """Continuous-batching generation with optional MTP speculation (greedy or sampled per
    request: :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams`).

    Args:
        fd_config: serving config (``speculative_config.method = None`` for plain decoding).
        runner: the target step and proposer round (:class:`.collaborators.Runner`): in this
            process a :class:`~.target_runner.TargetRunner`, in serving the runner that drives
            worker processes (:class:`fastdeploy_mtp.serving.processes.remote_runner.RemoteRunner`).
        handover: reads a handed-over slot state (splitwise;
            :class:`~fastdeploy_mtp.runtime.collaborators.SlotHandover`).
        prefill_chunk_size: see :class:`~fastdeploy_mtp.runtime.scheduler.Scheduler`.
        max_positions: positions the model can encode (prompt + output must fit; ``None`` =
            only ``max_model_len``).
        detokenize: token ids -> text, for requests with stop strings (``sampling.stop``);
            without it such requests are refused.

    :func:`fastdeploy_mtp.assembly.build_engine` builds one from a model (and MTP layer).

    The loop is :meth:`step` (one schedule + target step + proposer round); :meth:`generate`
    runs it until a batch of requests completes, a server calls it as requests arrive.

    Splitwise roles (``scheduler_config.splitwise_role``): on a ``"prefill"`` instance a
    request leaves after the step that emitted its first token and drafted its first MTP
    tokens (:attr:`StepEvents.handed_off`; its KV blocks stay held until
    :meth:`release_handoff`); a ``"decode"`` instance takes such requests through
    :meth:`add_transferred`: once a slot and blocks are free it calls ``kv_fetcher(request,
    block_ids)``, which fills the blocks (or fails) and reports with :meth:`transfer_done`;
    the slot is then loaded whole and decodes on from the prefill instance's drafts.

    One bad request cannot poison the engine: :meth:`generate` refuses it at submission (and
    queues nothing of that call), or aborts it alone if it fails while running; the engine is
    left empty and usable after every call, whatever it raised.
    """

    def __init__(
        self,
        fd_config: FDConfig,
        runner: Runner,
        *,
        handover: SlotHandover,
        prefill_chunk_size: int = 0,
        record_trace: bool = False,
        max_positions: int | None = None,
        detokenize: Detokenize | None = None,
    ):
        self.fd_config = fd_config
        self.detokenize = detokenize
        self._eos = {int(t) for t in np.asarray(fd_config.model_config.eos_token_id).reshape(-1)}
        #: with ``record_trace``: one ``(step, request_id, task, emitted tokens, drafts)``
        #: tuple per slot and target forward, for tests and debugging.
        self.trace: list[tuple] | None = [] if record_trace else None
        self.runner: Runner = runner
        self.handover = handover
        self.scheduler = Scheduler(
            fd_config,
            prefill_chunk_size,
            vocab_size=self.runner.vocab_size,
            max_positions=max_positions,
            handover=handover,
        )
        spec = fd_config.speculative_config
        k = spec.num_speculative_tokens if spec.enabled else 0
        self.metrics = Metrics.for_drafts(k, spec.method)
        self.role = fd_config.scheduler_config.splitwise_role
        #: splitwise decode: ``kv_fetcher(request, block_ids)`` starts filling the blocks of a
        #: handed-over request (see the class docstring); it must end in :meth:`transfer_done`.
        self.kv_fetcher: Callable[[Request, list[int]], None] | None = None

    def close(self) -> None:
        """Release the runner (the MTP layer's caches: detach / unpublish shared ones; a
        remote runner stops its processes)."""
        self.runner.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_requests(
        self, requests: Sequence[Request], max_arrival_step: int | None = None
    ) -> None:
        """Queue ``requests`` for :meth:`step` (all or nothing; see :meth:`generate` for what
        is checked). Raises :class:`~fastdeploy_mtp.runtime.request.InvalidRequestError`."""
        if isinstance(requests, Request):
            raise TypeError(
                "add_requests: `requests` must be a sequence of Request, got one Request"
            )
        requests = list(requests)
        check_stop_strings(requests, self.detokenize)
        self.scheduler.add_requests(requests, max_arrival_step=max_arrival_step)

    def add_transferred(self, req: Request) -> None:
        """Splitwise decode: queue a request a prefill instance handed over: ``req`` carries
        its prompt, the first token(s) in ``output_token_ids``, its ``max_tokens`` and the
        slot state in ``handoff_state``. Checked like :meth:`add_requests`, plus the state
        against this engine's buffers (the same speculation, ``max_model_len`` and batch
        layout as the prefill instance); raises
        :class:`~fastdeploy_mtp.runtime.request.InvalidRequestError` (field ``handoff``)."""
        check_transferred(req, self.role, self.runner, self.handover)
        check_stop_strings([req], self.detokenize)
        self.scheduler.add_requests([req])
        req.emitted_count = len(req.output_token_ids)  # the prefill instance handed those out
        if req.sampling.logprobs is not None:  # and their logprobs: one entry per token here too
            req.output_logprobs = [TokenLogprob(int(t), float("nan")) for t in req.output_token_ids]

    def transfer_done(self, req: Request, error: BaseException | None = None) -> None:
        """Report the end of ``req``'s KV transfer (``kv_fetcher``): with ``error`` the request
        is aborted (its blocks freed); otherwise its slot loads and decodes from the next
        step. If ``req`` was aborted meanwhile, its held blocks are freed now."""
        if req.finished:
            self.scheduler.release(req.request_id)
        elif error is not None:
            self._abort(req, error, {})
            self.scheduler.release(req.request_id)
        else:
            self.scheduler.kv_arrived(req)

    def release_handoff(self, request_id: str) -> int:
        """Splitwise prefill: the decode instance has copied (or given up on) the KV blocks of
        handed-off ``request_id``: free them. Returns how many were held."""
        return self.scheduler.release(request_id)

    @property
    def has_work(self) -> bool:
        """Requests are queued or running."""
        return self.scheduler.has_work

    def step(self, step: int) -> StepEvents:
        """Run engine step ``step`` (requests with ``arrival_step <= step`` may start): schedule,
        load the tasks, one target step + proposer round, and hand out the emitted tokens.

        Never raises for one request's fault: a task whose data cannot reach the model is
        aborted alone, and an error inside the model step aborts every request holding a
        slot (they share the step); both are reported in ``StepEvents.failed``. Finished
        requests leave their slots. ``StepEvents.ran`` is False when nothing was scheduled."""
        events = StepEvents()
        failures: dict[str, BaseException] = {}
        decode_lens = self.runner.decode_lens()
        scheduled = self.scheduler.schedule(step, decode_lens)
        holders = [s.request for _, s in sorted(self.scheduler.slots.items())]
        for req in self.scheduler.take_admitted_transfers():
            self._fetch_kv(req, failures)
        tasks = self._drop_invalid_tasks(scheduled, failures)
        if tasks:
            try:
                self.runner.insert_tasks(tasks)
                if self.role == "prefill":  # the slots whose prompt is done leave after it
                    final = [t for t in tasks if t.task_type == RequestType.PREFILL]
                    self.runner.set_exports([t.idx for t in final if t.is_final_chunk])
                out = self.runner.execute()
            except Exception as exc:
                self._abort_all(exc, failures, running_only=True)
            else:
                events.ran = True
                self.scheduler.cache_computed(tasks, out.mtp_unseen)
                self._collect(step, tasks, out, events)
        events.failed.extend(
            (r, failures[r.request_id]) for r in holders if r.request_id in failures
        )
        return events

    def _fetch_kv(self, req: Request, failures: dict[str, BaseException]) -> None:
        """Start the KV transfer of handed-over ``req`` into the blocks it was just given."""
        blocks = list(self.scheduler.slots[req.idx].blocks)
        try:
            if self.kv_fetcher is None:
                raise RuntimeError("this decode engine has no kv_fetcher to receive KV blocks")
            self.kv_fetcher(req, blocks)
        except Exception as exc:
            self._abort(req, exc, failures)
            self.scheduler.release(req.request_id)

    def _collect(
        self, step: int, tasks: list[Request], out: StepOutput, events: StepEvents
    ) -> None:
        """Hand out what step ``step`` emitted for ``tasks``: each request's new tokens (less
        a tail that could begin a stop string), then finish it or, on a prefill instance, hand
        it off."""
        self.metrics.count_forward(out)
        for req in tasks:
            if req.task_type == RequestType.PREFILL and not req.is_final_chunk:
                continue
            if req.task_type in (RequestType.DECODE, RequestType.IMPORT):
                self.metrics.count_decode(
                    out, req.idx, imported=req.task_type == RequestType.IMPORT
                )
            stopped = self._take_tokens(step, req, out)
            done = stopped or bool(out.stop_flags[req.idx])
            handing_off = (
                not done and self.role == "prefill" and req.task_type == RequestType.PREFILL
            )
            ready = (
                len(req.output_token_ids)
                if done or handing_off
                else safe_to_emit(req, self.detokenize)
            )
            ready = max(ready, req.emitted_count)
            delta = req.output_token_ids[req.emitted_count : ready]
            req.emitted_count = ready
            self.metrics.generated_tokens += len(delta)
            events.emitted.append((req, delta))
            if done:
                self._finish(req, stopped, events)
            elif handing_off:
                self._hand_off(req, out, events)

    def _take_tokens(self, step: int, req: Request, out: StepOutput) -> bool:
        """Append slot ``req.idx``'s tokens of ``out`` (and their logprobs, and the step's draft
        logprobs) to ``req``'s output, cut at its first stop token id or stop string; returns
        whether one hit."""
        idx = req.idx
        new = [int(t) for t in out.accept_tokens[idx, : int(out.accept_num[idx])]]
        if self.trace is not None:
            self.trace.append(
                (step, req.request_id, req.task_type.name, new, [int(d) for d in out.drafts[idx]])
            )
        drafts = out.draft_logprobs.get(idx) if req.sampling.include_draft_logprobs else None
        return append_output(req, new, drafts, out.logprobs.get(idx, []), self.detokenize)

    def _finish(self, req: Request, stopped: bool, events: StepEvents) -> None:
        """``req`` completed this step (``stopped``: at a stop token id or string): say why,
        and free its slot."""
        req.finish_reason = finish_reason(req, stopped, self._eos)
        self.runner.free_slot(req.idx)
        self.scheduler.finish(req.idx)
        events.finished.append(req)

    def _hand_off(self, req: Request, out: StepOutput, events: StepEvents) -> None:
        """The request got its first token and drafts on this prefill instance: its slot is
        freed, its blocks are held for the decode instance, and it leaves the engine."""
        state = out.exports.get(req.idx)
        if state is None:
            raise RuntimeError(
                f"the runner did not export the state of slot {req.idx} ({req.request_id!r})"
            )
        self.runner.free_slot(req.idx)
        blocks = list(self.scheduler.slots[req.idx].blocks)
        self.scheduler.finish(req.idx, hold=True)
        self.metrics.handed_off += 1
        events.handed_off.append(HandedOffRequest(req, state, blocks))

    def generate(
        self,
        requests: Sequence[Request],
        progress: Callable[[int, int], None] | None = None,
        max_steps: int = 1_000_000,
    ) -> dict[str, list[int]]:
        """Run every request to completion (EOS or ``max_tokens``); returns the generated ids
        per ``request_id`` (of every request that finished during the call, including any
        queued earlier through the scheduler). ``progress(done, total)`` is called as
        requests finish.

        Submission is all or nothing: every request is checked first
        (:meth:`~fastdeploy_mtp.runtime.scheduler.Scheduler.validate`: a fresh ``Request``,
        a ``request_id`` not queued, running or repeated in the call, integer token ids in
        ``[0, vocab_size)``, ``max_tokens > 0``, prompt + ``max_tokens`` + K + 1 within
        ``max_model_len``, KV blocks within a slot and the cache); if one is refused this
        raises :class:`~fastdeploy_mtp.runtime.request.InvalidRequestError` naming the
        request and the field, and nothing is queued.

        A request that fails while it runs is aborted: its slot and KV blocks are freed, its
        :attr:`~fastdeploy_mtp.runtime.request.Request.error` is set, and the others go on
        (and produce the tokens they would have alone). A request whose next prompt chunk
        is invalid (changed after submission) is aborted alone, before the step; an error
        raised inside a step cannot be pinned on one request, so every request holding a
        slot then is aborted with it (queued ones go on). When the loop ends with aborted
        requests, this raises :class:`~fastdeploy_mtp.runtime.request.GenerationError` with
        the finished requests' ``results`` and the ``failures``. The same happens, for every
        unfinished request, when ``max_steps`` engine steps did not suffice; any other
        exception (e.g. from ``progress``) aborts every unfinished request and propagates. In
        every case the engine is left empty and usable."""
        if isinstance(requests, Request):
            raise TypeError("generate: `requests` must be a sequence of Request, got one Request")
        requests = list(requests)
        self.add_requests(requests, max_arrival_step=max_steps)
        total, done = len(requests), 0
        results: dict[str, list[int]] = {}
        failures: dict[str, BaseException] = {}
        start = time.perf_counter()
        step = 0
        try:
            while self.scheduler.has_work:
                if step >= max_steps:
                    error = RuntimeError(
                        f"generation did not finish within {max_steps} engine steps"
                    )
                    self._abort_all(error, failures, running_only=False)
                    raise GenerationError(results, failures, str(error))
                arrival = self.scheduler.next_arrival()
                if not self.scheduler.slots and arrival is not None and arrival > step:
                    step = arrival  # nothing runs until then: skip the empty steps
                events = self.step(step)
                step += 1
                failures.update((req.request_id, err) for req, err in events.failed)
                for req in events.finished:
                    results[req.request_id] = list(req.output_token_ids)
                    done += 1
                    if progress is not None:
                        progress(done, total)
        except BaseException as exc:
            self._abort_all(exc, failures, running_only=False)  # nothing left after max_steps
            raise
        finally:
            self.metrics.wall_seconds += time.perf_counter() - start
        if failures:
            raise GenerationError(results, failures)
        return results
