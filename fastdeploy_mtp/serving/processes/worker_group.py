"""The processes of one ``serve`` deployment, as the engine sees them: :class:`WorkerGroup`
launches the cache manager and one worker per tensor-parallel rank, waits for them, watches
them (one that exits is a :class:`~fastdeploy_mtp.serving.token_channel.base.WorkerDiedError`
instead of a hang), receives only the answers it awaits, and stops them.

The children run ``python -m fastdeploy_mtp.serving.processes.cache_manager`` and
``python -m fastdeploy_mtp.serving.processes.worker_process`` with the layout's arguments, in
this process's environment less the credentials (:data:`UNUSED_BY_CHILDREN`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from ...credentials import API_KEY_ENV, SECRET_ENV
from ...distributed import find_free_port_range
from ..messages.engine_workers import Done, Failed, Ready, Shutdown, decode_worker_message
from ..messages.wire import MessageError
from ..token_channel.base import TokenReader, WorkerDiedError
from ..token_channel.channel import open_reader
from .child_process import sigint_held
from .layout import ServeLayout

#: The credentials a child process is never given: the cache manager and the workers
#: authenticate nothing (the engine's socket to them is guarded by the file system, the
#: HTTP server and the splitwise hand-over run in the main process), so they do not inherit
#: the API key or the splitwise secret from the environment.
UNUSED_BY_CHILDREN = (API_KEY_ENV, SECRET_ENV)


def free_port(avoid: int = 0) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (never ``avoid``)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != avoid:
            return port


class WorkerGroup:
    """The cache manager and the workers of one deployment, started here.

    Args:
        layout: what every process agrees on (model, speculation, batch, TP, port).
        n, k: the slots and the drafts per slot of the token channel.
        blocks: the KV blocks of each rank's caches (for the progress line).
        cache_names: per rank, the names of its KV caches (removed here if the cache manager
            was killed before it could).
        progress: called with one line per start-up stage (model load, caches, workers).
        start_timeout: seconds the cache manager and the workers may take to get ready.
        log: where the children's stdout/stderr go (``None``: inherited).
        reserved_port: a port the children must not take (the HTTP server's).
        dropped: where worker-socket messages that are not the awaited answer are counted
            (:class:`~fastdeploy_mtp.credentials.DroppedMessages`, channel ``worker``).
    """

    def __init__(
        self,
        layout: ServeLayout,
        n: int,
        k: int,
        blocks: int,
        cache_names: list[list[str]],
        progress: Callable[[str], None] | None = None,
        start_timeout: float = 300.0,
        log: Any = None,
        reserved_port: int = 0,
        dropped: Any = None,
    ):
        import zmq

        from ... import ops
        from ...ops import messaging
        from . import runtime_dir

        self.layout = layout
        self._ops = ops
        self.reserved_port = reserved_port
        self._progress = progress or (lambda line: None)
        self._cache_names = cache_names
        self._dead: str | None = None
        self._started = False  # every worker said it is ready
        self.procs: dict[str, subprocess.Popen] = {}
        self._reader: TokenReader | None = None
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
            self._start(n, k, blocks, start_timeout, log)
        except BaseException:
            self.close()
            raise

    def _spawn(self, name: str, module: str, extra: list[str], log: Any) -> None:
        # -P: the child imports the package this process runs, not a `fastdeploy_mtp/` folder in
        # the working directory (a clone's source tree, without its native build, would shadow
        # the installed package when `serve` is started from the clone's root)
        cmd = [sys.executable, "-P", "-m", module, *self.layout.to_args(), *extra]
        env = {k: v for k, v in os.environ.items() if k not in UNUSED_BY_CHILDREN}
        env["INFERENCE_MSG_QUEUE_ID"] = str(self.layout.msg_queue_id)
        with sigint_held():  # the child ignores SIGINT from its first instruction
            self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        from .runtime_dir import write_owner

        # for a survivor's clean-up
        write_owner(self.runtime_dir, [p.pid for p in self.procs.values()])

    def _start(self, n: int, k: int, blocks: int, timeout: float, log: Any) -> None:
        tp = self.layout.tensor_parallel_size
        self._reader = open_reader(self.layout, n, k)  # before the workers: they attach it
        self._progress(f"starting the cache manager ({tp} rank(s), {blocks} blocks)")
        self._spawn("cache manager", "fastdeploy_mtp.serving.processes.cache_manager", [], log)
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
                "fastdeploy_mtp.serving.processes.worker_process",
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
        self._started = True

    def close(self, timeout: float = 10.0) -> None:
        """Stop every child (``shutdown``, then SIGTERM, then SIGKILL), remove the token queue."""
        import zmq

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
        # a deployment that lost a process or hung will not shut down in order: do not wait long;
        # workers still starting read no shutdown message: SIGTERM at once
        grace = 0.0 if not self._started else min(timeout, 1.0) if self._dead else timeout
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
        from ...ipc.kv_caches import CACHE_READY_SIGNAL

        names = [f"{CACHE_READY_SIGNAL}.{self.layout.engine_worker_queue_port}"]
        for rank_names in self._cache_names:
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
