"""Random batch states for the n-gram op tests, with small vocabularies and planted
repeats so that matches (of every length, in prompt and history) are frequent."""

from __future__ import annotations

import numpy as np
import pytest

HYBRID_NAMES = (
    "input_ids",
    "input_ids_len",
    "pre_ids",
    "step_idx",
    "draft_token_num",
    "draft_tokens",
    "seq_lens_this_time",
    "seq_lens_decoder",
    "max_dec_len",
)
MATCH_NAMES = (
    "input_ids",
    "input_ids_len",
    "token_ids_all",
    "prompt_lens",
    "step_idx",
    "draft_token_num",
    "draft_tokens",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "max_dec_len",
)


def _history(rng, prompt, prompt_len, length, vocab):
    """Generated tokens that often copy stretches of the prompt or of themselves."""
    out = rng.integers(0, vocab, size=length, dtype=np.int64)
    pos = 0
    while pos < length:
        run = int(rng.integers(1, 12))
        kind = rng.random()
        if kind < 0.4 and prompt_len > 0:
            src = int(rng.integers(0, prompt_len))
            piece = prompt[src : src + run]
        elif kind < 0.6 and pos > 0:
            src = int(rng.integers(0, pos))
            piece = out[src : min(src + run, pos)].copy()
        else:
            piece = rng.integers(0, vocab, size=run, dtype=np.int64)
        piece = piece[: length - pos]
        out[pos : pos + len(piece)] = piece
        pos += max(len(piece), 1)
    return out


def hybrid_state(rng, bsz, *, vocab, prompt_max, hist_max, k, p_idle=0.15, p_prefill=0.1):
    width_in = max(prompt_max, 1)
    width_pre = max(hist_max, 1) + 2
    input_ids = rng.integers(0, vocab, size=(bsz, width_in), dtype=np.int64)
    lens = rng.integers(0, prompt_max + 1, size=bsz).astype(np.int64)
    pre_ids = np.zeros((bsz, width_pre), np.int64)
    steps = rng.integers(0, hist_max + 1, size=bsz).astype(np.int64)
    for b in range(bsz):
        pre_ids[b, : steps[b] + 1] = _history(rng, input_ids[b], lens[b], steps[b] + 1, vocab)
    draft = np.full((bsz, k + 1), -1, np.int64)
    slt = rng.integers(1, k + 2, size=bsz).astype(np.int32)
    for b in range(bsz):
        draft[b, : slt[b]] = rng.integers(0, vocab, size=slt[b])
    dec = rng.integers(1, 4096, size=bsz).astype(np.int32)
    idle = rng.random(bsz) < p_idle
    slt[idle] = 0
    dec[idle] = 0
    dec[rng.random(bsz) < p_prefill] = 0  # prefill items: decoder length 0, slt > 0
    max_dec = steps + rng.integers(-1, 12, size=bsz)
    dtn = np.full(bsz, k, np.int32)
    return [input_ids, lens, pre_ids, steps, dtn, draft, slt, dec, max_dec.astype(np.int64)]


def match_state(rng, bsz, *, vocab, prompt_max, hist_max, k, p_idle=0.15, p_prefill=0.15):
    width_in = max(prompt_max, 1)
    input_ids = rng.integers(0, vocab, size=(bsz, width_in), dtype=np.int64)
    lens = rng.integers(0, prompt_max + 1, size=bsz).astype(np.int64)
    width_all = width_in + hist_max + 2
    token_ids_all = np.zeros((bsz, width_all), np.int64)
    steps = rng.integers(0, hist_max + 1, size=bsz).astype(np.int64)
    for b in range(bsz):
        token_ids_all[b, : lens[b]] = input_ids[b, : lens[b]]
        token_ids_all[b, lens[b] : lens[b] + steps[b] + 1] = _history(
            rng, input_ids[b], lens[b], steps[b] + 1, vocab
        )
    draft = rng.integers(0, vocab, size=(bsz, k + 1)).astype(np.int64)
    slt = rng.integers(1, 50, size=bsz).astype(np.int32)
    enc = np.where(rng.random(bsz) < p_prefill, rng.integers(1, 64, size=bsz), 0).astype(np.int32)
    dec = np.where(rng.random(bsz) < p_idle, 0, rng.integers(1, 4096, size=bsz)).astype(np.int32)
    dtn = rng.integers(0, k + 1, size=bsz).astype(np.int32)
    max_dec = steps + rng.integers(-1, 12, size=bsz)
    return [
        input_ids,
        lens,
        token_ids_all,
        lens.copy(),
        steps,
        dtn,
        draft,
        slt,
        enc,
        dec,
        max_dec.astype(np.int64),
    ]


def decoding_match_state(seed, bsz, **shape):
    """:func:`match_state` from ``default_rng(seed)`` with every item decoding (no idle and no
    prefill items); `shape` gives vocab, prompt_max, hist_max and k."""
    return match_state(np.random.default_rng(seed), bsz, p_idle=0.0, p_prefill=0.0, **shape)


def assert_wrapper_reads_threshold(monkeypatch, op, names, reference, tensors, attrs, env):
    """The Paddle wrapper of `op` takes its threshold from an environment variable: `env` =
    (variable, its default, another value). Unset and then set to the other value, the wrapper's
    drafts must be the reference's at that threshold, and the two results must differ."""
    paddle = pytest.importorskip("paddle")
    import fastdeploy_mtp.ops as ops

    variable, default, other = env
    results = {}
    for value, threshold in ((None, default), (str(other), other)):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
        pts = [paddle.to_tensor(x.copy()) for x in tensors]
        getattr(ops, op)(*pts, *attrs)
        want = reference(*tensors, *attrs, threshold)
        for name in ("seq_lens_this_time", "draft_tokens"):
            np.testing.assert_array_equal(pts[names.index(name)].numpy(), want[name])
        results[threshold] = want["seq_lens_this_time"]
    assert not np.array_equal(results[default], results[other])


def assert_same_without_worker_threads(backend, op: str, names, reference, tensors, attrs) -> None:
    """A worker std::thread that cannot be created (no address space left for its stack:
    RLIMIT_AS in a child process) used to reach std::terminate; the search now falls back to
    the calling thread. `attrs` ask for worker threads; the result must match the reference."""
    from tests.ops.child_process import run_in_child
    from tests.support.compare import assert_all_exact

    want = reference(*tensors, *attrs)
    backend.run(op, tensors, attrs)  # everything the call needs is loaded before the limit
    got = run_in_child(
        lambda: backend.run(op, tensors, attrs), timeout=120, address_space_headroom=2 << 20
    )
    assert_all_exact(names, got, want, context=f"{backend.name}, no threads")
