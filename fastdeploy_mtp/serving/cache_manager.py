"""The cache-manager process: creates exactly the KV caches of the model's cache spec
(:meth:`~fastdeploy_mtp.serving.layout.ServeLayout.cache_specs`: every target layer and every
MTP layer, each of its spec's shape and dtype) for every tensor-parallel rank, publishes each
by name (``set_data_ipc``, FastDeploy's names), then raises
``cache_ready_signal.<engine_worker_queue_port>[rank]``. It holds them until SIGTERM (or its
parent's death), then removes every name it created.

``python -m fastdeploy_mtp.serving.cache_manager --model DIR --speculative_config JSON ...``
(the arguments of :class:`~fastdeploy_mtp.serving.layout.ServeLayout`). It prints one progress
line per rank to stderr.
"""

from __future__ import annotations

import argparse
import signal
import sys

import numpy as np

from .child_process import Terminated, become_child_process, install_stop_handlers
from .layout import ServeLayout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastdeploy_mtp.serving.cache_manager", description=__doc__)
    ServeLayout.add_args(ap)
    layout = ServeLayout.from_args(ap.parse_args(argv))
    become_child_process()
    import paddle

    from ..ipc.kv_caches import CACHE_READY_SIGNAL, publish_caches, unpublish_caches
    from ..ipc.signals import IPCSignal
    from ..models.cache_spec import owned_by

    arch = layout.arch()
    specs = layout.cache_specs(arch)
    tp = layout.tensor_parallel_size
    ready = IPCSignal(
        CACHE_READY_SIGNAL, np.zeros([tp], np.int32), np.int32, suffix=layout.engine_worker_queue_port, create=True
    )
    published: list[tuple[list[paddle.Tensor], list[str]]] = []
    try:
        for rank, names in enumerate(layout.cache_names(specs)):
            tensors = [paddle.zeros(list(s.shape), dtype=s.dtype) for s in specs]
            publish_caches(tensors, names)
            published.append((tensors, names))
            ready.value[rank] = 1  # type: ignore[index]
            mib = sum(s.nbytes for s in specs) / 2**20
            dtypes = ",".join(sorted({s.dtype for s in specs}))
            print(
                f"[cache manager] rank {rank}: {len(specs)} KV caches published ({len(owned_by(specs, 'target'))} "
                f"target + {len(owned_by(specs, 'mtp'))} MTP, {dtypes}, {mib:.1f} MiB)",
                file=sys.stderr,
                flush=True,
            )
        install_stop_handlers()  # again, in case Paddle's set-up reinstalled its own
        while True:  # until SIGTERM (Terminated; the kernel sends it too if the parent dies)
            signal.pause()
    except Terminated:
        return 0
    finally:
        # a second SIGTERM (or a Ctrl-C reaching the group) must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for tensors, names in published:
            unpublish_caches(tensors, names)
        ready.clear()


if __name__ == "__main__":
    sys.exit(main())
