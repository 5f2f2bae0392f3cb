"""The cache-manager process: creates exactly the KV caches of the model's cache spec
(:meth:`~fastdeploy_mtp.serving.processes.layout.ServeLayout.cache_specs`: every target layer and
every MTP layer, each of its spec's shape and dtype) for every tensor-parallel rank, publishes each
by name (``set_data_ipc``, FastDeploy's names), then raises
``cache_ready_signal.<engine_worker_queue_port>[rank]``. It holds them until SIGTERM (or its
parent's death, which it polls for), then removes every name it created. If the engine died
(SIGKILL), the cache manager is the survivor that cleans up for it: it waits for the workers to exit
(and stops them if they do not), then removes the SysV token queue and the deployment's runtime
directory, so nothing of the deployment is left behind.

``python -m fastdeploy_mtp.serving.processes.cache_manager --model DIR --speculative_config JSON
...`` (the arguments of :class:`~fastdeploy_mtp.serving.processes.layout.ServeLayout`). It prints
one progress line per rank to stderr (at ``--log_level`` info or debug).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time

from .child_process import Terminated, become_child_process, install_stop_handlers
from .layout import ServeLayout
from .start_up import shows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fastdeploy_mtp.serving.processes.cache_manager", description=__doc__
    )
    ServeLayout.add_args(ap)
    layout = ServeLayout.from_args(ap.parse_args(argv))
    parent = os.getppid()
    # no SIGTERM from the kernel when the engine dies: the loop below notices it and cleans
    # up for the engine, which a signal landing in a handler of Paddle's could cut short
    become_child_process(parent_death_signal=False)
    import paddle

    from ...ipc.kv_caches import CacheLike, cache_ready_signal, publish_caches, unpublish_caches
    from ...models.cache_spec import owned_by

    arch = layout.arch()
    kv_specs = layout.cache_specs(arch)
    states = layout.state_specs(arch)  # a hybrid model's linear-attention states, per slot
    specs: list[CacheLike] = [*kv_specs, *states]
    ready = cache_ready_signal(
        layout.tensor_parallel_size, layout.engine_worker_queue_port, create=True
    )
    published: list[tuple[list[paddle.Tensor], list[str]]] = []
    try:
        for rank, names in enumerate(layout.cache_names(specs)):
            tensors = [paddle.zeros(list(s.shape), dtype=s.dtype) for s in specs]
            publish_caches(tensors, names)
            published.append((tensors, names))
            ready.value[rank] = 1  # type: ignore[index]
            mib = sum(s.nbytes for s in kv_specs) / 2**20
            dtypes = ",".join(sorted({s.dtype for s in kv_specs}))
            extra = (
                f"; {len(states)} linear-attention state tensors, "
                f"{sum(s.nbytes for s in states) / 2**20:.1f} MiB"
                if states
                else ""
            )
            if shows(layout.log_level, "info"):
                print(
                    f"[cache manager] rank {rank}: {len(kv_specs)} KV caches published "
                    f"({len(owned_by(kv_specs, 'target'))} target + "
                    f"{len(owned_by(kv_specs, 'mtp'))} MTP, {dtypes}, {mib:.1f} MiB){extra}",
                    file=sys.stderr,
                    flush=True,
                )
        install_stop_handlers()  # again, in case Paddle's set-up reinstalled its own
        while os.getppid() == parent:  # until SIGTERM (Terminated) or the engine's death
            time.sleep(PARENT_POLL_S)
        return 0
    except Terminated:
        return 0
    finally:
        # a second SIGTERM (or a Ctrl-C reaching the group) must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for tensors, names in published:
            unpublish_caches(tensors, names)
        ready.clear()
        if _engine_died(layout, parent):  # it could not clean up: do it for it
            clean_up_after_engine(layout)


#: seconds between the cache manager's checks that the engine still runs
PARENT_POLL_S = 0.1


def _engine_died(layout: ServeLayout, parent: int, wait: float = 5.0) -> bool:
    """Whether the engine is gone (this process was re-parented) rather than stopping the
    deployment, which it marks in the runtime directory before it sends SIGTERM. A SIGTERM
    without the mark (an operator's) waits up to ``wait`` s for either."""
    from . import runtime_dir

    directory = runtime_dir.deployment_dir(layout.engine_worker_queue_port)
    deadline = time.monotonic() + wait
    while not (directory / runtime_dir.STOPPING_NAME).exists():
        if os.getppid() != parent:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return False


def clean_up_after_engine(layout: ServeLayout, timeout: float = 10.0) -> None:
    """What the engine removes when it stops, done by the cache manager when the engine was
    killed: the workers gone (the kernel sent them SIGTERM; SIGKILL after ``timeout`` s), then
    the token queue (a worker still running could re-create it), the shm token segment and the
    runtime directory."""
    from ...ipc.signals import process_alive
    from ...ops.messaging import remove_msg_queue
    from ..token_channel.shared_memory import shm_name
    from . import runtime_dir

    owner = (
        runtime_dir.read_owner(runtime_dir.deployment_dir(layout.engine_worker_queue_port)) or {}
    )
    children = owner.get("children")
    # (pid, start time) of each recorded child but this process: a pid whose start time
    # differs is another process now, and is never signalled
    workers = [
        (c["pid"], c.get("start"))
        for c in (children if isinstance(children, list) else [])
        if isinstance(c, dict) and isinstance(c.get("pid"), int) and c["pid"] != os.getpid()
    ]

    def running(child: tuple[int, object]) -> bool:
        return runtime_dir.process_start(child[0]) == child[1] and process_alive(child[0])

    # they were sent SIGTERM by the kernel too (the engine's death): give them ``timeout`` s
    for kill in (False, True):
        for pid, _ in workers if kill else []:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while workers and time.monotonic() < deadline:
            workers = [c for c in workers if running(c)]
            time.sleep(0.05)
    with contextlib.suppress(OSError):
        remove_msg_queue(layout.msg_queue_id)
    with contextlib.suppress(OSError):  # the shm token channel's segment (--token-channel shm)
        os.unlink(os.path.join("/dev/shm", shm_name(layout.engine_worker_queue_port)))
    runtime_dir.remove(layout.engine_worker_queue_port)
    print(
        "[cache manager] the engine died: workers stopped, token queue and runtime directory "
        "removed",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
