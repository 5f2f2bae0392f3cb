"""The processes of the cross-process IPC tests (run as scripts, one role per process).

    python ipc_roles.py creator  TAG LAYERS [--crash-after N]
    python ipc_roles.py attacher TAG LAYERS [--timeout S]

creator: allocates per-layer key/value caches named like upstream
(``key_caches_{layer}_rank0.device0``, prefixed with TAG so tests never collide), fills them
with its pattern, publishes them with set_data_ipc, raises ``cache_ready_signal.TAG`` and
waits for ``attach_done.TAG``; then checks the attacher's pattern in its own tensors and
tears everything down (unset_data_ipc with unlink, signals cleared). With --crash-after N it
publishes N caches, prints CRASH-POINT and sleeps (the test kills it).

attacher: waits for the ready signal (also before the creator exists), attaches every cache
with share_external_data, checks the creator's pattern, writes its own, raises
``attach_done``, releases its attachments (close_ipc) and exits. A creator that dies first
makes it print GONE and exit 3; a timeout prints TIMEOUT and exits 4.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastdeploy_mtp.ipc.signals import CreatorGoneError, IPCSignal, IPCSignalError  # noqa: E402

SHAPE = [6, 2, 4, 8]  # [blocks, kv heads, block size, head dim]
DTYPES = ("float16", "bfloat16", "float32", "int8", "uint8")


def cache_names(tag: str, layers: int):
    for layer in range(layers):
        for kind in ("key_caches", "value_caches"):
            yield layer, f"{tag}{kind}_{layer}_rank0.device0"


def dtype_of(layer: int) -> str:
    return DTYPES[layer % len(DTYPES)]


def pattern(index: int, who: int) -> np.ndarray:
    n = int(np.prod(SHAPE))
    return ((np.arange(n) * (3 + who) + index * 7 + who * 11) % 61).reshape(SHAPE)


def creator(tag: str, layers: int, crash_after: int, timeout: float) -> int:
    import paddle

    from fastdeploy_mtp.ops import set_data_ipc, unset_data_ipc

    ready = IPCSignal("cache_ready_signal", np.zeros([1], np.int32), np.int32, suffix=tag)
    done = IPCSignal("attach_done", np.zeros([1], np.int32), np.int32, suffix=tag)
    caches = []
    for i, (layer, name) in enumerate(cache_names(tag, layers)):
        if crash_after >= 0 and i == crash_after:
            print("CRASH-POINT", flush=True)
            time.sleep(600)
        t = paddle.to_tensor(pattern(i, 0), dtype=dtype_of(layer))
        set_data_ipc(t, name)
        caches.append((i, name, t))
    ready.value[0] = 1
    print("READY", flush=True)
    try:
        done.wait_for(lambda v: v[0] == 1, timeout=timeout)
    except IPCSignalError as e:
        print("TIMEOUT", e, flush=True)
        return 4
    for i, name, t in caches:  # the attacher's writes, seen in the creator's own tensors
        got = t.astype("float32").numpy()
        if not np.array_equal(got, pattern(i, 1).astype(np.float32)):
            print("MISMATCH", name, flush=True)
            return 5
    for _, name, t in caches:
        unset_data_ipc(t, name, False, True)
    ready.clear()
    done.clear()
    print("CREATOR-OK", flush=True)
    return 0


def attacher(tag: str, layers: int, timeout: float) -> int:
    import paddle

    from fastdeploy_mtp.ops import share_external_data, unset_data_ipc

    try:
        ready = IPCSignal(
            "cache_ready_signal",
            np.zeros([1], np.int32),
            np.int32,
            suffix=tag,
            create=False,
            timeout=timeout,
        )
        print("WAITING", flush=True)
        ready.wait_for(lambda v: v[0] == 1, timeout=timeout)
    except CreatorGoneError as e:
        print("GONE", e, flush=True)
        return 3
    except IPCSignalError as e:
        print("TIMEOUT", e, flush=True)
        return 4
    done = IPCSignal("attach_done", np.zeros([1], np.int32), np.int32, suffix=tag, create=False)
    attached = []
    for i, (layer, name) in enumerate(cache_names(tag, layers)):
        t = share_external_data(paddle.empty([], dtype_of(layer)), name, SHAPE)
        if not np.array_equal(t.astype("float32").numpy(), pattern(i, 0).astype(np.float32)):
            print("MISMATCH", name, flush=True)
            return 5
        paddle.assign(paddle.to_tensor(pattern(i, 1), dtype=dtype_of(layer)), output=t)
        attached.append((name, t))
    done.value[0] = 1
    for name, t in attached:
        unset_data_ipc(t, name, True, False)  # as FastDeploy's clear_mtp_cache
    ready.close()
    done.close()
    print("ATTACHER-OK", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("creator", "attacher"))
    ap.add_argument("tag")
    ap.add_argument("layers", type=int)
    ap.add_argument("--crash-after", type=int, default=-1)
    ap.add_argument("--timeout", type=float, default=30.0)
    a = ap.parse_args()
    if a.role == "creator":
        return creator(a.tag, a.layers, a.crash_after, a.timeout)
    return attacher(a.tag, a.layers, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
