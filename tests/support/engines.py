"""Helpers for engine and proposer tests: a small random-weight model (fast; greedy
equivalence does not depend on the weights), config and request builders."""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from fastdeploy_mtp.config import (
    CacheConfig,
    FDConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from fastdeploy_mtp.models import ModelConfig as ArchConfig, MTPLayer, TinyTargetModel
from fastdeploy_mtp.runtime.request import Request

VOCAB, ORI_VOCAB, EOS = 64, 60, 61


def tiny_arch(**overrides) -> ArchConfig:
    """The engine tests' model shapes: vocab 64 (60 real), 2 layers, H = 32, 4 q heads, 2 kv
    heads, SwiGLU width 64, KV blocks of 8 tokens; `overrides` replace any field."""
    fields = dict(
        vocab_size=VOCAB,
        ori_vocab_size=ORI_VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        block_size=8,
    )
    return ArchConfig(**{**fields, **overrides})


def adaptive_spec(
    k: int, window: int, interval: int, steps: int | None = None, **more: Any
) -> SpeculativeConfig:
    """MTP with ``k`` drafts from ``steps`` (default ``k``) substeps and the draft planner on:
    acceptance window ``window``, probes every ``interval`` rounds; ``more``: other keys."""
    return SpeculativeConfig(
        method="mtp",
        num_speculative_tokens=k,
        num_model_steps=k if steps is None else steps,
        adaptive_draft_length=True,
        acceptance_window=window,
        adaptive_probe_interval=interval,
        **more,
    )


def build_random_model():
    """(target, mtp): :func:`tiny_arch`, random weights (seeded)."""
    paddle.seed(1234)
    arch = tiny_arch()
    target = TinyTargetModel(arch)
    mtp = MTPLayer(arch, target)
    target.eval()
    mtp.eval()
    return target, mtp


def make_config(
    k: int = 0,
    steps: int = 1,
    hybrid: bool = False,
    max_num_seqs: int = 4,
    eos=(EOS,),
    max_model_len: int = 160,
    budget: int = 0,
    block_size: int = 8,
    vocab=VOCAB,
    ori_vocab=ORI_VOCAB,
    hidden=32,
) -> FDConfig:
    spec = (
        SpeculativeConfig(
            method="mtp",
            num_speculative_tokens=k,
            num_model_steps=steps,
            mtp_strategy="with_ngram" if hybrid else "default",
        )
        if k
        else SpeculativeConfig(method=None)
    )
    return FDConfig(
        model_config=ModelConfig(
            max_model_len=max_model_len,
            vocab_size=vocab,
            ori_vocab_size=ori_vocab,
            hidden_size=hidden,
            eos_token_id=list(eos),
        ),
        speculative_config=spec,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget or max(64, max_num_seqs * 8 + 16),
        ),
        cache_config=CacheConfig(block_size=block_size, total_block_num=max_num_seqs * 32),
    )


def make_requests(
    seed: int,
    count: int,
    *,
    stagger: int = 1,
    min_prompt=3,
    max_prompt=40,
    min_new=5,
    max_new=30,
    vocab=ORI_VOCAB,
):
    """Requests with random prompts; request i arrives at engine step ``i * stagger``."""
    rng = np.random.default_rng(seed)
    return [
        Request(
            f"r{i}",
            rng.integers(0, vocab, size=int(rng.integers(min_prompt, max_prompt))).tolist(),
            max_tokens=int(rng.integers(min_new, max_new)),
            arrival_step=i * stagger,
        )
        for i in range(count)
    ]


def check_k1_rounds_against_transformers(
    loaded, folder, prompt: list[int], max_tokens: int, echo: bool
):
    """Run ``prompt`` through an :class:`~fastdeploy_mtp.runtime.engine.Engine` over ``loaded``
    (``load_model(folder)``: target, MTP layer, config) with K = 1 and assert that every step
    emits what transformers' own ``generate(use_mtp=True)`` does round for round (an EOS id
    that never comes up, so the request runs to ``max_tokens``); with ``echo`` also that drafts
    were accepted in some rounds and rejected in others. Returns (the rounds' tokens, the
    engine)."""
    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.checks.reference import Reference

    target, mtp, config = loaded
    want = [list(r.tokens) for r in Reference(folder).generate_rounds(prompt, max_tokens)]
    eos = min(
        set(range(config.vocab_size)) - {tok for step in want for tok in step}
    )  # never emitted
    cfg = make_config(
        1, eos=(eos,), block_size=config.block_size, vocab=config.vocab_size,
        ori_vocab=config.ori_vocab_size, hidden=config.hidden_size,
    )  # fmt: skip
    engine = build_engine(cfg, target, mtp, record_trace=True)
    out = engine.generate([Request("r", list(prompt), max_tokens=max_tokens)])
    assert [list(t[3]) for t in engine.trace] == want
    assert out["r"] == [tok for step in want for tok in step]
    if echo:  # drafts accepted in some rounds, rejected in others
        assert any(len(step) == 2 for step in want[1:]) and any(len(step) == 1 for step in want[1:])
    return want, engine
