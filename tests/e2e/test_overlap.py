"""Overlap schedule: in rounds without prefill the proposer sizes its substeps by an upper
bound instead of reading token counts back to the host. Tokens stay identical, and the
proposer (and the ops it calls) make no host read in those rounds."""

from __future__ import annotations

import inspect

import paddle
import pytest

from fastdeploy_mtp.runtime.engine import Engine
from tests.engine_testlib import make_config, make_requests

HOST_READS = ("numpy", "item", "tolist")
#: Code that must not read device values back during a steady-state round. Model code reads
#: the metadata back only to validate it (``ForwardMeta.check``, on by default); its unchecked
#: forward is covered by tests/models/test_attention_sync_free.py.
CHECKED_MODULES = ("fastdeploy_mtp.proposer", "fastdeploy_mtp.ops")


def overlap_config(k, steps, hybrid=False):
    cfg = make_config(k, steps, hybrid, max_num_seqs=4)
    cfg.scheduler_config.enable_overlap_schedule = True
    return cfg


@pytest.mark.parametrize("k,steps,hybrid", [(2, 1, False), (3, 3, False), (3, 1, True)])
def test_overlap_rounds_keep_greedy_equivalence(random_model, k, steps, hybrid):
    target, mtp = random_model
    base = Engine(make_config(0, max_num_seqs=4), target).generate(make_requests(21, 6))
    spec = Engine(overlap_config(k, steps, hybrid), target, mtp).generate(make_requests(21, 6))
    assert spec == base


def test_no_host_sync_in_steady_state_proposer_rounds(random_model, monkeypatch):
    target, mtp = random_model
    engine = Engine(overlap_config(3, 3), target, mtp)
    proposer = engine.runner.proposer
    state = {"guarded": False, "guarded_rounds": 0}
    violations = []

    def guard(name, original):
        def wrapper(self, *args, **kwargs):
            if state["guarded"]:
                caller = inspect.currentframe().f_back
                module = caller.f_globals.get("__name__", "")
                if module.startswith(CHECKED_MODULES):
                    violations.append(f"{module}:{caller.f_lineno} called Tensor.{name}()")
                    raise AssertionError(f"host read Tensor.{name}() from {module} during an overlap round")
            return original(self, *args, **kwargs)

        return wrapper

    for name in HOST_READS:
        monkeypatch.setattr(paddle.Tensor, name, guard(name, getattr(paddle.Tensor, name)))
    original_run = proposer.run

    def guarded_run(*args, **kwargs):
        state["guarded"] = proposer.overlap_round
        state["guarded_rounds"] += int(proposer.overlap_round)
        try:
            return original_run(*args, **kwargs)
        finally:
            state["guarded"] = False

    monkeypatch.setattr(proposer, "run", guarded_run)
    out = engine.generate(make_requests(22, 4, stagger=0, min_new=12, max_new=20))
    assert not violations, violations
    assert state["guarded_rounds"] >= 5, "no steady-state decode round was checked"
    assert len(out) == 4


def test_the_guard_catches_a_host_read(random_model, monkeypatch):
    """The check above can fail: without the overlap schedule the proposer reads the token
    count with .item() every substep."""
    target, mtp = random_model
    engine = Engine(make_config(2, 1, max_num_seqs=4), target, mtp)
    proposer = engine.runner.proposer
    calls = []
    original = paddle.Tensor.item

    def spy(self, *args, **kwargs):
        module = inspect.currentframe().f_back.f_globals.get("__name__", "")
        if module.startswith(CHECKED_MODULES):
            calls.append(module)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(paddle.Tensor, "item", spy)
    engine.generate(make_requests(23, 2, stagger=0))
    assert calls and all(m.startswith("fastdeploy_mtp.proposer") for m in calls)
    assert proposer.enable_overlap is False
