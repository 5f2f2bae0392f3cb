"""The cache-manager process: creates the KV caches of every target layer and every MTP
layer for every tensor-parallel rank, publishes each by name (``set_data_ipc``, FastDeploy's
names), then raises ``cache_ready_signal.<engine_worker_queue_port>[rank]``. It holds them
until SIGTERM (or its parent's death), then removes every name it created.

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

    from ..ipc.kv_caches import CACHE_READY_SIGNAL, cache_names, publish_caches, unpublish_caches
    from ..ipc.signals import IPCSignal
    from ..models import kv_cache_shape

    arch = layout.arch()
    cfg = layout.fd_config(0, arch)
    tp = layout.tensor_parallel_size
    num_layers = cfg.model_config.num_hidden_layers
    num_mtp_layers = 1 if cfg.speculative_config.enabled else 0
    blocks = cfg.cache_config.total_block_num
    shape = kv_cache_shape(arch, blocks, tp)
    ready = IPCSignal(
        CACHE_READY_SIGNAL, np.zeros([tp], np.int32), np.int32, suffix=layout.engine_worker_queue_port, create=True
    )
    published: list[tuple[list[paddle.Tensor], list[str]]] = []
    try:
        for rank in range(tp):
            names = cache_names(0, num_layers + num_mtp_layers, rank, layout.device_ids[rank])
            tensors = [paddle.zeros(shape, dtype="float32") for _ in names]
            publish_caches(tensors, names)
            published.append((tensors, names))
            ready.value[rank] = 1  # type: ignore[index]
            mib = len(names) * int(np.prod(shape)) * 4 / 2**20
            print(
                f"[cache manager] rank {rank}: {len(names)} KV caches ({num_layers} target + {num_mtp_layers} MTP "
                f"layers, key and value, each {shape} float32, {mib:.1f} MiB in all) published",
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
