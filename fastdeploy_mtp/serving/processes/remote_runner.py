"""The engine's side of the worker processes: :class:`RemoteRunner` drives the deployment's
workers (:class:`~.worker_group.WorkerGroup`) with the
:class:`~fastdeploy_mtp.runtime.collaborators.Runner` surface the engine loop uses, so the
serving engine and the offline :class:`~fastdeploy_mtp.runtime.engine.Engine` are one loop.

Per step: the step message (ZMQ, :class:`~fastdeploy_mtp.serving.messages.engine_workers.Step`)
goes to every rank; rank 0 writes the emitted tokens to the deployment's token channel
(:mod:`fastdeploy_mtp.serving.token_channel`: a shared-memory segment, or FastDeploy's SysV
message) and then sends its ``done`` reply, after which the engine reads them. While it
waits, the engine watches every child: one that exits fails the step with
:class:`WorkerDiedError` (the engine then fails the requests in flight) instead of hanging.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...runtime.guided import GuidedSlots, GuidedStats
from ...runtime.request import Request
from ...runtime.target_runner import StepOutput, check_prefill_task
from ..messages.engine_workers import Done, Failed, Ready, Step, StepResult, task_message
from ..token_channel.base import WorkerDiedError, WorkerStepError
from .layout import ServeLayout
from .worker_group import WorkerGroup, free_port

if TYPE_CHECKING:  # imports Paddle, which the engine imports after its set-up
    from ...models.cache_spec import CacheSpec

__all__ = ["RemoteRunner", "WorkerDiedError", "WorkerStepError", "free_port"]


class RemoteRunner(WorkerGroup):
    """Launches and drives the worker processes of one deployment.

    Args:
        step_timeout: seconds a step may take before the deployment counts as hung.
        layout, progress, start_timeout, log, reserved_port, dropped: see
            :class:`~.worker_group.WorkerGroup`.
    """

    def __init__(
        self,
        layout: ServeLayout,
        progress: Callable[[str], None] | None = None,
        step_timeout: float = 300.0,
        start_timeout: float = 300.0,
        log: Any = None,
        reserved_port: int = 0,
        dropped: Any = None,
    ):
        arch = layout.arch()
        self.fd_config = layout.fd_config(0, arch)
        #: the workers' grammar set-up: a task their check would refuse (and fail the whole step
        #: with) is refused here first, alone
        self.guided = GuidedSlots.for_model(self.fd_config, arch)
        #: the caches of each rank (the cache manager creates exactly these)
        self.cache_specs = layout.cache_specs()
        self.vocab_size = self.fd_config.model_config.vocab_size
        spec = self.fd_config.speculative_config
        self.k = spec.num_speculative_tokens if spec.enabled else 0
        self.n = self.fd_config.scheduler_config.max_num_seqs
        self.step_timeout = step_timeout
        self._decode_lens = np.zeros([self.n], np.int32)
        self._pending = Step(step=0)
        #: buffers to check handed-over slot states against
        self._template: tuple[Any, Any] | None = None
        self._host_caches: list[list[np.ndarray]] | None = None
        self._host_cache_tensors: list[tuple[list[Any], list[str]]] = []
        self._step = 0
        blocks = self.fd_config.cache_config.total_block_num
        names = layout.cache_names(self.cache_specs)
        super().__init__(
            layout,
            self.n,
            self.k,
            blocks,
            names,
            progress,
            start_timeout,
            log,
            reserved_port,
            dropped,
        )

    def close(self, timeout: float = 10.0) -> None:
        """Detach this process's views of the caches, then stop every child (see
        :meth:`WorkerGroup.close`)."""
        from ...ipc.kv_caches import detach_caches

        self._host_caches = None
        for tensors, names in self._host_cache_tensors:
            detach_caches(tensors, names)
        self._host_cache_tensors = []
        super().close(timeout)

    # ---- the Runner surface ----------------------------------------------------------------
    def decode_lens(self) -> np.ndarray:
        return self._decode_lens

    def check_task(self, req: Request) -> None:
        check_prefill_task(req, self.fd_config.model_config.max_model_len, self.vocab_size)
        self.guided.check_task(req)

    def insert_tasks(self, tasks: Sequence[Request]) -> None:
        for req in tasks:
            self._pending.tasks.append(task_message(req, req.is_first_chunk))

    def free_slot(self, idx: int) -> None:
        self._pending.free.append(int(idx))
        self._decode_lens[idx] = 0

    def abort_slot(self, req: Request) -> None:
        self._pending.abort.append(int(req.idx))
        self._decode_lens[req.idx] = 0

    def set_exports(self, idxs: Sequence[int]) -> None:
        self._pending.export = [int(i) for i in idxs]

    def check_handoff(self, state: object) -> None:
        """Check a handed-over slot state against buffers shaped like the workers' (built
        here once; the workers check it again when they load it)."""
        from ...runtime.input_batch import make_target_inputs
        from ...splitwise.handoff import check_slot_state

        if self._template is None:
            target = make_target_inputs(self.fd_config)
            draft = None
            if self.fd_config.speculative_config.enabled:
                from ...proposer.proposer_inputs import ProposerInputBatch

                draft = ProposerInputBatch(self.fd_config, target)
            self._template = (target, draft)
        target, draft = self._template
        check_slot_state(state, target, draft, vocab_size=self.vocab_size)

    # ---- KV caches, for splitwise transfer ------------------------------------------------
    def all_cache_specs(self) -> list[CacheSpec]:
        """Each rank's caches (:class:`~fastdeploy_mtp.models.cache_spec.CacheSpec`): every
        target layer's, then every MTP layer's."""
        return list(self.cache_specs)

    def cache_names(self) -> list[list[str]]:
        """Per rank, the IPC name of each cache of :meth:`all_cache_specs`."""
        return self.layout.cache_names(self.cache_specs)

    def host_caches(self) -> list[list[np.ndarray]]:
        """Every rank's KV caches, attached by name in this process, as writable numpy views
        (no copy; 16-bit floats viewed as their bits), in :meth:`all_cache_specs` order;
        detached by :meth:`close`."""
        if self._host_caches is None:
            from ...ipc.kv_caches import attach_spec_caches, host_view

            views = []
            for names in self.cache_names():
                tensors = attach_spec_caches(self.cache_specs, names)
                self._host_cache_tensors.append((tensors, names))
                views.append([host_view(t) for t in tensors])
            self._host_caches = views
        return self._host_caches

    def execute(self) -> StepOutput:
        import zmq

        if self._dead:
            raise WorkerDiedError(f"the deployment is down: {self._dead}")
        self.check_children()  # every step: a busy deployment notices a lost process too
        self._step += 1
        msg, self._pending = self._pending, Step(step=0)
        msg.step = self._step
        payload = msg.encode()
        for rank in range(self.layout.tensor_parallel_size):
            try:
                self._sock.send_multipart([f"rank{rank}".encode(), payload])
            except zmq.ZMQError as exc:
                self.check_children()
                raise WorkerDiedError(f"cannot reach worker rank {rank}: {exc}") from None
        head = self._replies()
        accept_tokens, accept_num = self._read_tokens()
        self._decode_lens = np.asarray(head.decode_lens, np.int32)
        return StepOutput(
            accept_tokens=accept_tokens,
            accept_num=accept_num,
            stop_flags=np.asarray(head.stop_flags, bool),
            drafts=np.asarray(head.drafts, np.int64).reshape([self.n, self.k]),
            decode_mask=np.asarray(head.decode_mask, bool),
            num_tokens=head.num_tokens,
            exports=dict(head.exports),
            logprobs=dict(head.logprobs),
            draft_logprobs=dict(head.draft_logprobs),
            guided=GuidedStats(
                head.guided_checked,
                head.guided_cut,
                head.guided_seconds,
                head.guided_forced,
                head.guided_forced_accepted,
            ),
            draft_methods=np.asarray(head.draft_methods, np.int64),
            mtp_unseen=np.asarray(head.mtp_unseen, bool),
        )

    def _replies(self) -> StepResult:
        """Every rank's answer to the step just sent; rank 0's result."""
        replies: dict[int, Done | Failed] = {}
        errors: list[str] = []
        deadline = time.monotonic() + self.step_timeout
        while len(replies) < self.layout.tensor_parallel_size:
            reply = self._recv(deadline, f"step ({self.step_timeout:g} s)", self._step)
            assert not isinstance(reply, Ready)
            if reply.rank in replies:  # a second answer of one rank to this step: not awaited
                if self.dropped is not None:
                    self.dropped.add("worker")
                continue
            replies[reply.rank] = reply
            if isinstance(reply, Failed):
                errors.append(f"worker rank {reply.rank}: {reply.message}")
        if errors:
            self._drain_tokens()
            if self.layout.tensor_parallel_size > 1:  # the ranks' states may have diverged
                self._dead = "; ".join(errors)
                raise WorkerDiedError(f"a tensor-parallel worker failed a step: {self._dead}")
            raise WorkerStepError("; ".join(errors))
        head = replies[0]
        if not isinstance(head, Done) or head.result is None:
            self._drain_tokens()
            raise WorkerStepError(f"worker rank 0 answered step {self._step} without its result")
        return head.result

    def _read_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """The step's tokens from the token channel: ``accept_tokens [N, K+1]`` int64,
        ``accept_num [N]`` int64 (a lost message marks the deployment dead)."""
        assert self._reader is not None
        try:
            return self._reader.read(self._step)
        except WorkerDiedError as exc:
            self._dead = str(exc)
            raise

    def _drain_tokens(self) -> None:
        """Drop tokens a failed step may have left in the channel."""
        if self._reader is not None:
            self._reader.drain()
