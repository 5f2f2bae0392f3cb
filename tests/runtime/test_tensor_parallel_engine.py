"""The reference engine with a TP=2 model (two real processes in a gloo group) emits exactly
the TP=1 tokens on the demo prompts, greedy, in two MTP modes, and both ranks agree."""

from __future__ import annotations

import os

import pytest

from fastdeploy_mtp.models import load_tiny
from tests.support.tp import run_ranks
from tests.support.tp_child import ENGINE_MODES, run_engine

MAX_TOKENS = 64  # the demo default


@pytest.fixture(scope="module")
def tp1_outputs():
    target, mtp, arch = load_tiny()
    return {
        label: run_engine(target, mtp, arch, k, s, h, MAX_TOKENS, 1, 0)
        for label, k, s, h in ENGINE_MODES
    }


def test_tp2_engine_matches_tp1_token_for_token(tp1_outputs):
    ranks = run_ranks("engine", 2, str(MAX_TOKENS), timeout=120)
    _, _, arch = load_tiny()
    for label, *_ in ENGINE_MODES:
        want, tps1 = tp1_outputs[label]
        assert all(len(seq) == MAX_TOKENS for seq in want)
        for rank, res in enumerate(ranks):
            assert res[label]["ids"] == want, f"{label}: rank {rank} differs from TP=1"
        if os.environ.get("FDMTP_TP_REPORT"):
            print(
                f"\n{label}: TP=1 {tps1:.0f} tok/s, "
                f"TP=2 {ranks[0][label]['tokens_per_second']:.0f} tok/s; "
                f"TP=2 run (2 processes, both modes) {ranks[0]['_seconds']:.1f} s"
            )
    for res in ranks:  # each rank's caches hold its half of the key/value heads
        assert res["kv_cache_shape"] == [
            3,
            arch.num_key_value_heads // 2,
            arch.block_size,
            arch.head_dim,
        ]
