"""The engine's side of the worker processes: :class:`RemoteRunner` launches the cache
manager and one worker per tensor-parallel rank, and drives them with the
:class:`~fastdeploy_mtp.runtime.interfaces.Runner` surface the engine loop uses, so the
serving engine and the offline :class:`~fastdeploy_mtp.runtime.engine.Engine` are one loop.

Per step: the step message (ZMQ, :class:`~.messages.Step`) goes to every rank; rank 0 writes the emitted
tokens to the deployment's token channel (:mod:`.token_channel`: a shared-memory segment,
or FastDeploy's SysV message) and then sends its ``done`` reply, after which the engine
reads them. While it waits, the
engine watches every child: one that exits fails the step with :class:`WorkerDiedError`
(the engine then fails the requests in flight) instead of hanging.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..distributed import find_free_port_range
from ..runtime.guided import GuidedSlots, GuidedStats
from ..runtime.request import Request
from ..runtime.target_runner import StepOutput, check_prefill_task
from .layout import ServeLayout
from .messages import (
    Done,
    Failed,
    MessageError,
    Ready,
    Shutdown,
    Step,
    StepResult,
    decode_worker_message,
    task_message,
)
from .token_channel import TokenReader, WorkerDiedError, WorkerStepError, open_reader

if TYPE_CHECKING:  # imports Paddle, which the engine imports after its set-up
    from ..models.cache_spec import CacheSpec

__all__ = ["RemoteRunner", "WorkerDiedError", "WorkerStepError", "free_port"]


def free_port(avoid: int = 0) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (never ``avoid``)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != avoid:
            return port


class RemoteRunner:
    """Launches and drives the worker processes of one deployment.

    Args:
        layout: what every process agrees on (model, speculation, batch, TP, port).
        progress: called with one line per start-up stage (model load, caches, workers).
        step_timeout: seconds a step may take before the deployment counts as hung.
        start_timeout: seconds the cache manager and the workers may take to get ready.
        log: where the children's stdout/stderr go (``None``: inherited).
        reserved_port: a port the children must not take (the HTTP server's).
        dropped: where worker-socket messages that are not the awaited answer are counted
            (:class:`~fastdeploy_mtp.credentials.DroppedMessages`, channel ``worker``).
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
        import zmq

        from .. import ops
        from ..ops import messaging
        from . import runtime_dir

        self.layout = layout
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
        self.reserved_port = reserved_port
        self._progress = progress or (lambda line: None)
        self._decode_lens = np.zeros([self.n], np.int32)
        self._pending = Step(step=0)
        self._template: tuple[Any, Any] | None = (
            None  # buffers to check handed-over slot states against
        )
        self._host_caches: list[list[np.ndarray]] | None = None
        self._host_cache_tensors: list[tuple[list[Any], list[str]]] = []
        self._step = 0
        self._dead: str | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self._reader: TokenReader | None = None
        self._ops = ops
        self.dropped = dropped
        # the private runtime directory (refused while another live deployment owns the
        # port), then the token queue, ours alone; both before any child starts
        self.runtime_dir = runtime_dir.claim(layout.engine_worker_queue_port)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            messaging.create_msg_queue(layout.msg_queue_id)
            self._sock.bind(runtime_dir.endpoint(layout.engine_worker_queue_port))
        except BaseException:
            self._sock.close(0)
            self._ctx.term()
            runtime_dir.remove(layout.engine_worker_queue_port)
            raise
        try:
            self._start(start_timeout, log)
        except BaseException:
            self.close()
            raise

    # ---- start-up / shutdown --------------------------------------------------------------
    def _spawn(self, name: str, module: str, extra: list[str], log: Any) -> None:
        cmd = [sys.executable, "-m", module, *self.layout.to_args(), *extra]
        env = dict(os.environ, INFERENCE_MSG_QUEUE_ID=str(self.layout.msg_queue_id))
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        from .runtime_dir import write_owner

        write_owner(
            self.runtime_dir, [p.pid for p in self.procs.values()]
        )  # for a survivor's clean-up

    def _start(self, timeout: float, log: Any) -> None:
        tp = self.layout.tensor_parallel_size
        self._reader = open_reader(
            self.layout, self.n, self.k
        )  # before the workers: they attach it
        self._progress(
            f"starting the cache manager ({tp} rank(s), {self.fd_config.cache_config.total_block_num} blocks)"
        )
        self._spawn("cache manager", "fastdeploy_mtp.serving.cache_manager", [], log)
        master = 0
        while tp > 1 and not master:  # gloo store + rendezvous ports, clear of the HTTP port
            first = find_free_port_range(tp + 1)
            master = 0 if first <= self.reserved_port < first + tp + 1 else first
        for rank in range(tp):
            self._progress(
                f"starting worker rank {rank}/{tp} (loads its model shard, attaches its caches)"
            )
            self._spawn(
                f"worker rank {rank}",
                "fastdeploy_mtp.serving.worker_process",
                ["--local_rank", str(rank), "--tp_master_port", str(master)],
                log,
            )
        ready: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(ready) < tp:
            msg = self._recv(deadline, "start-up")
            if isinstance(msg, Ready):
                ready.add(msg.rank)
                self._progress(
                    f"worker rank {msg.rank} ready (pid {msg.pid}): model loaded, caches attached"
                )
            elif isinstance(msg, Failed):
                raise WorkerDiedError(f"worker rank {msg.rank} failed to start: {msg.message}")

    def close(self, timeout: float = 10.0) -> None:
        """Stop every child (``shutdown``, then SIGTERM, then SIGKILL), remove the token queue."""
        import zmq

        from ..ipc.kv_caches import detach_caches

        self._host_caches = None
        for tensors, names in self._host_cache_tensors:
            detach_caches(tensors, names)
        self._host_cache_tensors = []
        from .runtime_dir import mark_stopping

        mark_stopping(self.layout.engine_worker_queue_port)  # the children's SIGTERM is a shutdown
        workers = [name for name in self.procs if name.startswith("worker")]
        for rank, name in enumerate(workers):
            if self.procs[name].poll() is None:
                try:
                    self._sock.send_multipart(
                        [f"rank{rank}".encode(), Shutdown().encode()], zmq.NOBLOCK
                    )
                except zmq.ZMQError:
                    pass
        # a deployment that lost a process or hung will not shut down in order: do not wait long
        grace = min(timeout, 1.0) if self._dead else timeout
        deadline = time.monotonic() + grace
        for name in [*workers, "cache manager"]:  # the cache manager last: workers detach first
            proc = self.procs.get(name)
            if proc is None:
                continue
            if name == "cache manager" and proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.terminate()  # (a stopped process takes it only once continued: then SIGKILL)
                try:
                    proc.wait(2 if self._dead else 5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
        self._sock.close(0)
        self._ctx.term()
        self._ops.remove_msg_queue(self.layout.msg_queue_id)
        if self._reader is not None:
            self._reader.close()  # removes the shm token segment
            self._reader = None
        self._remove_orphaned_names()
        from .runtime_dir import remove

        remove(self.layout.engine_worker_queue_port)

    def _remove_orphaned_names(self) -> None:
        """The cache manager removes its names when it stops; if it was killed (SIGKILL) it
        could not, so remove whatever of this deployment's names is still there."""
        from ..ipc.kv_caches import CACHE_READY_SIGNAL

        names = [f"{CACHE_READY_SIGNAL}.{self.layout.engine_worker_queue_port}"]
        for rank_names in self.cache_names():
            names += rank_names
        for name in names:
            path = os.path.join("/dev/shm", name)
            try:
                if os.stat(path).st_uid == os.geteuid():
                    os.unlink(path)
            except FileNotFoundError:
                pass

    # ---- liveness ---------------------------------------------------------------------------
    def check_children(self) -> None:
        """Raise :class:`WorkerDiedError` if a worker or the cache manager has exited."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                self._dead = f"{name} (pid {proc.pid}) exited with code {code}"
                raise WorkerDiedError(f"the deployment lost a process: {self._dead}")

    @property
    def dead(self) -> str | None:
        """Why the deployment is unusable (a child exited), or ``None``."""
        return self._dead

    def _recv(self, deadline: float, what: str, step: int | None = None) -> Ready | Done | Failed:
        """The next awaited worker message: at start-up (``step`` ``None``) a ``ready`` or an
        error; during step ``step`` that step's ``done`` or error (or an error saying the worker
        could not read the step message). Anything else (a frame not from a worker's identity,
        a malformed message or one of another protocol version, another step's answer, a rank
        that is not the sender's) is dropped and counted; the wait goes on until ``deadline``."""
        ranks = {f"rank{r}".encode(): r for r in range(self.layout.tensor_parallel_size)}
        while True:
            if self._sock.poll(100):
                frames = self._sock.recv_multipart()
                msg = _awaited(frames, ranks, step)
                if msg is not None:
                    return msg
                if self.dropped is not None:
                    self.dropped.add("worker")
            self.check_children()
            if time.monotonic() > deadline:
                self._dead = f"no answer from the workers within the {what} timeout"
                raise WorkerDiedError(self._dead)

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
        from ..runtime.input_batch import make_target_inputs
        from ..splitwise.handoff import check_slot_state

        if self._template is None:
            target = make_target_inputs(self.fd_config)
            draft = None
            if self.fd_config.speculative_config.enabled:
                from ..proposer.proposer_inputs import ProposerInputBatch

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
            from ..ipc.kv_caches import attach_spec_caches, host_view

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
            guided=GuidedStats(head.guided_checked, head.guided_cut, head.guided_seconds),
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


def _awaited(
    frames: list[bytes], ranks: dict[bytes, int], step: int | None
) -> Ready | Done | Failed | None:
    """The message in ``frames`` if it is one the engine awaits (see :meth:`RemoteRunner._recv`)."""
    if len(frames) != 2 or frames[0] not in ranks:
        return None
    try:
        msg = decode_worker_message(frames[1], f"worker {frames[0].decode(errors='replace')}")
    except MessageError:
        return None
    if msg.rank != ranks[frames[0]]:
        return None
    if step is None:
        return (
            msg
            if isinstance(msg, Ready) or (isinstance(msg, Failed) and msg.step is None)
            else None
        )
    if isinstance(msg, Ready):
        return None
    return msg if msg.step == step or (isinstance(msg, Failed) and msg.step is None) else None
