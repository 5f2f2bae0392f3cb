"""initialize_kv_cache's two paths with real processes (spawned, not threads):

* attach: a cache-manager process creates the caches of every layer (the target's and the
  MTP layer's) under FastDeploy's names, raises ``cache_ready_signal``; the worker's target
  runner and proposer wait, attach them by name, and the engine generates through them (same
  tokens as with local caches; writes seen both ways);
* publish: the proposer creates its caches and publishes them; another process attaches them
  by name and reads what the worker's MTP layer wrote.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from tests.support.engines import make_config, make_requests
from tests.support.servers import device_ids

PORT = 47000 + os.getpid() % 1000  # names unique to this test run
#: device ids DEVICE and DEVICE + 1 (they name the caches): other runs on this host use others
DEVICE = int(device_ids(2).split(",")[0])


def _cache_manager(conn, names, shape, port):
    import paddle

    from fastdeploy_mtp import ops
    from fastdeploy_mtp.ipc.signals import IPCSignal

    caches = []
    for i, name in enumerate(names):
        t = paddle.full(shape, float(i + 1), dtype="float32")
        ops.set_data_ipc(t, name)
        caches.append(t)
    ready = IPCSignal("cache_ready_signal", np.zeros([1], np.int32), np.int32, suffix=port)
    ready.value[0] = 1
    conn.send("ready")
    conn.recv()  # the worker generated through our caches
    conn.send([float(paddle.abs(c - float(i + 1)).sum()) for i, c in enumerate(caches)])
    conn.recv()
    for t, name in zip(caches, names):
        ops.unset_data_ipc(t, name, False, True)
    ready.clear()
    conn.send("done")


def _attacher(conn, names, shape):
    import paddle

    from fastdeploy_mtp import ops

    attached = [ops.share_external_data(paddle.empty([], dtype="float32"), n, shape) for n in names]
    conn.send([a.numpy() for a in attached])
    for t, n in zip(attached, names):
        ops.unset_data_ipc(t, n, True, False)


def leftovers(names):
    return [n for n in names if os.path.exists(f"/dev/shm/{n}")]


def test_worker_attaches_caches_created_by_a_cache_manager(random_model):
    from fastdeploy_mtp.assembly import build_engine

    target, mtp = random_model
    cfg = make_config(2, steps=2)
    cfg.cache_config.num_cpu_blocks = 1  # a cache manager owns the caches (FastDeploy's rule)
    cfg.cache_config.cache_ready_timeout = 60
    cfg.parallel_config.engine_worker_queue_port = PORT
    cfg.parallel_config.device_id = DEVICE
    shape = mtp.attn_backend.get_kv_cache_shape(cfg.cache_config.total_block_num)
    assert shape == target.attn_backend.get_kv_cache_shape(cfg.cache_config.total_block_num)
    layers = cfg.model_config.num_hidden_layers
    names = [
        f"{kind}_caches_{layer}_rank0.device{DEVICE}"
        for layer in range(layers + 1)
        for kind in ("key", "value")
    ]
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_cache_manager, args=(child, names, shape, PORT))
    proc.start()
    try:
        # the worker may start first: initialize_kv_cache waits for the signal
        engine = build_engine(cfg, target, mtp)
        proposer = engine.runner.proposer
        assert parent.poll(60) and parent.recv() == "ready"
        assert (
            proposer._attached == names[2 * layers :]
            and engine.runner._attached == names[: 2 * layers]
        )
        np.testing.assert_array_equal(
            engine.runner.caches[0].numpy(), np.full(shape, 1.0, np.float32)
        )
        np.testing.assert_array_equal(
            proposer.caches[0].numpy(), np.full(shape, 2 * layers + 1.0, np.float32)
        )
        spec = engine.generate(make_requests(31, 4))
        parent.send("generated")
        assert parent.poll(60)
        changed = parent.recv()
        assert all(c > 0 for c in changed), "the cache manager does not see the worker's writes"
        engine.close()
        parent.send("teardown")
        assert parent.poll(60) and parent.recv() == "done"
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    assert leftovers(names) == []
    base = build_engine(make_config(0), target).generate(make_requests(31, 4))
    assert spec == base


def test_published_caches_are_attached_by_another_process(random_model):
    from fastdeploy_mtp.assembly import build_engine

    target, mtp = random_model
    cfg = make_config(2, steps=1)
    cfg.cache_config.share_mtp_cache = True
    cfg.parallel_config.engine_worker_queue_port = PORT + 1
    cfg.parallel_config.device_id = DEVICE + 1  # names are per device
    with build_engine(cfg, target, mtp) as engine:
        engine.generate(make_requests(32, 3))
        proposer = engine.runner.proposer
        names = proposer.cache_names()
        assert proposer._published == names and all(os.path.exists(f"/dev/shm/{n}") for n in names)
        shape = list(proposer.caches[0].shape)
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_attacher, args=(child, names, shape))
        proc.start()
        assert parent.poll(60)
        seen = parent.recv()
        proc.join(60)
        assert proc.exitcode == 0
        for mine, theirs in zip(proposer.caches, seen):
            assert np.abs(theirs).sum() > 0
            np.testing.assert_array_equal(mine.numpy(), theirs)
    assert leftovers(names) == []


def test_attach_gives_up_with_a_clear_error_when_no_cache_manager_starts(random_model):
    from fastdeploy_mtp.ipc.signals import IPCSignalError
    from fastdeploy_mtp.proposer import MTPProposer
    from fastdeploy_mtp.runtime.input_batch import make_target_inputs

    target, mtp = random_model
    cfg = make_config(1)
    cfg.scheduler_config.splitwise_role = "decode"
    cfg.cache_config.cache_ready_timeout = 0.3
    cfg.parallel_config.engine_worker_queue_port = PORT + 2
    proposer = MTPProposer(cfg, target, 0, 0, make_target_inputs(cfg), model=mtp)
    with pytest.raises(IPCSignalError, match="cache_ready_signal"):
        proposer.initialize_kv_cache(16)


def _decode_proposer(random_model, port):
    from fastdeploy_mtp.proposer import MTPProposer
    from fastdeploy_mtp.runtime.input_batch import make_target_inputs

    target, mtp = random_model
    cfg = make_config(1)
    cfg.scheduler_config.splitwise_role = "decode"  # a cache manager owns the caches
    cfg.cache_config.cache_ready_timeout = 30
    cfg.parallel_config.engine_worker_queue_port = port
    cfg.parallel_config.device_id = DEVICE
    return MTPProposer(cfg, target, 0, 0, make_target_inputs(cfg), model=mtp)


def test_worker_refuses_a_ready_signal_left_by_a_dead_cache_manager(random_model):
    """A previous run's cache_ready_signal still holds 1 but its creator is gone: the worker
    used to attach that run's stale caches; now it stops with CreatorGoneError at once."""
    import struct
    import subprocess
    import sys
    import time

    from fastdeploy_mtp.ipc.signals import CreatorGoneError

    port = PORT + 3
    proposer = _decode_proposer(random_model, port)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert child.wait(timeout=60) == 0  # exited and reaped: its pid names no process
    path = f"/dev/shm/cache_ready_signal.{port}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, np.ones(1, np.int32).tobytes() + struct.pack("<Qq", 0x4C4E474953504446, child.pid))
    os.close(fd)
    try:
        t0 = time.monotonic()
        with pytest.raises(
            CreatorGoneError, match=r"cache_ready_signal.*the value it left is stale"
        ):
            proposer.initialize_kv_cache(16)
        assert time.monotonic() - t0 < 10 and proposer._attached == []
    finally:
        os.unlink(path)


def test_worker_refuses_caches_other_users_could_have_planted(random_model):
    """The ready signal is genuine but a cache name is world-writable (planted by another
    local user): the worker refuses to attach it instead of writing its KV cache there."""
    import paddle

    from fastdeploy_mtp import ops
    from fastdeploy_mtp.ipc.signals import IPCSignal

    port = PORT + 4
    proposer = _decode_proposer(random_model, port)
    names = proposer.cache_names()
    shape = proposer.model.attn_backend.get_kv_cache_shape(16)
    caches = [paddle.zeros(shape, dtype="float32") for _ in names]
    ready = IPCSignal("cache_ready_signal", np.ones([1], np.int32), np.int32, suffix=port)
    try:
        for t, n in zip(caches, names):
            ops.set_data_ipc(t, n)
        os.chmod(f"/dev/shm/{names[-1]}", 0o666)
        with pytest.raises(
            ops.OpError, match=rf"`{names[-1]}` has mode 0666: other users may read or write it"
        ):
            proposer.initialize_kv_cache(16)
        assert proposer._attached == []
    finally:
        for t, n in zip(caches, names):
            ops.unset_data_ipc(t, n, False, True)
        ready.clear()
    assert leftovers(names) == []
