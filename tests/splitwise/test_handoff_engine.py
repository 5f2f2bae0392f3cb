"""Splitwise prefill -> decode in one process: the decode engine continues a request from
the prefill engine's slot state and KV blocks, and the output equals the mixed engine's."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.engine_args import build_config, speculative_config
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.request import InvalidRequestError, Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from fastdeploy_mtp.splitwise.handoff import (
    HandoffError,
    check_slot_state,
    export_slot,
    first_drafts,
)
from tests.support.engines import build_random_model, make_config, make_requests
from tests.support.pd import LocalPD, role_config


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


@pytest.fixture(scope="module")
def random_model():
    return build_random_model()


def demo_requests(max_tokens=40):
    tok = ByteTokenizer()
    return [
        Request(f"p{i}", tok.encode(p), max_tokens=max_tokens + 3 * i)
        for i, p in enumerate(DEMO_PROMPTS)
    ]


@pytest.mark.parametrize(
    ("k", "steps", "hybrid"),
    [(1, 1, False), (3, 3, False), (3, 1, True), (8, 8, False), (0, 1, False)],
)
def test_demo_prompts_pd_equals_mixed_and_the_first_round_uses_the_prefill_drafts(
    shipped, k, steps, hybrid
):
    target, mtp, arch = shipped
    reqs = demo_requests()
    longest = max(len(r.prompt_token_ids) + r.max_tokens for r in reqs) + 2 * k + 8
    cfg = build_config(arch, speculative_config(k, steps if k else None, hybrid), 8, longest)
    mixed = build_engine(cfg, target, mtp if k else None).generate([r.fresh_copy() for r in reqs])
    pd = LocalPD(cfg, target, mtp if k else None)
    out = pd.run([r.fresh_copy() for r in reqs])
    assert out == mixed
    assert sorted(pd.handoffs) == sorted(mixed)
    assert all(pd.first_tokens[r] == mixed[r][:1] for r in mixed)
    m = pd.d.metrics
    if k:
        # the decode engine's first verify round checked the prefill engine's drafts ...
        assert m.handoff_drafts_proposed >= len(reqs) * min(steps, k)
        # ... and accepted some (the shipped MTP layer drafts well at position 1)
        assert m.handoff_drafts_accepted >= len(reqs) // 2, (
            m.handoff_drafts_accepted,
            m.handoff_drafts_proposed,
        )
    else:
        assert m.handoff_drafts_proposed == 0
    # the decode engine emitted every token but the first ones (it ran no prefill) ...
    assert m.generated_tokens == sum(len(v) - 1 for v in mixed.values())
    # ... and every block is back on both sides
    assert pd.p.metrics.handed_off == len(reqs)
    assert not pd.p.scheduler.held and not pd.d.scheduler.held
    for e in (pd.p, pd.d):
        assert len(e.scheduler.free_blocks) == e.scheduler.total_blocks
    pd.close()


@pytest.mark.parametrize(
    ("k", "steps", "hybrid"), [(1, 1, False), (3, 3, False), (3, 1, True), (8, 1, True)]
)
def test_staggered_chunked_prefill_and_slow_transfers_equal_mixed(random_model, k, steps, hybrid):
    """Requests arrive every other step, the prefill engine prefills in 5-token chunks and
    each transfer lands 3 steps after the decode engine asked for it."""
    target, mtp = random_model
    cfg = make_config(k, steps, hybrid, max_num_seqs=3)
    reqs = make_requests(11, 9, stagger=2, min_prompt=2, max_prompt=30)
    mixed = build_engine(cfg, target, mtp, prefill_chunk_size=5).generate(
        [r.fresh_copy() for r in reqs]
    )
    pd = LocalPD(cfg, target, mtp, fetch_delay=3, prefill_chunk_size=5)
    assert pd.run([r.fresh_copy() for r in reqs]) == mixed
    pd.close()


def test_distinct_mtp_layers_and_adaptive_drafts_through_prefill_and_decode(random_model):
    """Three distinct MTP layers (each with its own cache, all handed over) and adaptive draft
    length on the decode side: the output is the mixed engine's."""
    from fastdeploy_mtp.models.mtp_layer import MTPStack

    target, _ = random_model
    arch = type(target.config).from_dict({**target.config.to_dict(), "num_nextn_predict_layers": 3})
    stack = MTPStack(arch, target)
    stack.eval()
    cfg = make_config(3, 3, False, max_num_seqs=3)
    cfg.speculative_config.adaptive_draft_length = True
    cfg.speculative_config.adaptive_probe_interval = 2
    reqs = make_requests(12, 6, stagger=2, min_prompt=2, max_prompt=30)
    mixed = build_engine(cfg, target, stack, prefill_chunk_size=5).generate(
        [r.fresh_copy() for r in reqs]
    )
    pd = LocalPD(cfg, target, stack, fetch_delay=1, prefill_chunk_size=5)
    assert pd.run([r.fresh_copy() for r in reqs]) == mixed
    assert len(pd.d.runner.proposer.caches) == 6
    pd.close()


def test_slot_state_survives_json_and_is_checked_against_the_decode_engine(random_model):
    target, mtp = random_model
    cfg = make_config(3, 3)
    p = build_engine(role_config(cfg, "prefill"), target, mtp)
    p.add_requests([Request("a", [1, 2, 3, 4, 5], max_tokens=9)])
    ev = p.step(0)
    (h,) = ev.handed_off
    assert ev.finished == [] and h.request.output_token_ids and h.blocks == p.scheduler.held["a"]
    state = json.loads(json.dumps(h.state))
    drafts = first_drafts(state)
    assert len(drafts) == 3 and drafts == [
        int(t) for t in p.runner.share_inputs.draft_tokens.numpy()[0, 1:]
    ]
    d = build_engine(role_config(cfg, "decode"), target, mtp)
    d.runner.check_handoff(state)  # type: ignore[attr-defined]

    # another speculation set-up on the decode side: refused, naming the buffer
    other = build_engine(role_config(make_config(1, 1), "decode"), target, mtp)
    with pytest.raises(InvalidRequestError, match=r"`handoff`.*draft_tokens"):
        other.add_transferred(
            Request("a", [1, 2, 3, 4, 5], 9, output_token_ids=[3], handoff_state=state)
        )
    no_mtp = build_engine(role_config(make_config(0), "decode"), target, None)
    with pytest.raises(InvalidRequestError, match="MTP"):
        no_mtp.add_transferred(
            Request("a", [1, 2, 3, 4, 5], 9, output_token_ids=[3], handoff_state=state)
        )
    bad = json.loads(json.dumps(state))
    bad["draft"]["pre_ids"]["v"] = ["x"]
    with pytest.raises(HandoffError, match="pre_ids"):
        check_slot_state(bad, d.runner.share_inputs, d.runner.proposer.model_inputs)  # type: ignore[attr-defined]
    del bad["target"]["step_idx"]
    with pytest.raises(InvalidRequestError, match="step_idx"):
        d.add_transferred(Request("a", [1, 2, 3, 4, 5], 9, output_token_ids=[3], handoff_state=bad))
    assert not d.has_work  # nothing queued by the refusals
    with pytest.raises(InvalidRequestError, match="output_token_ids"):
        d.add_transferred(
            Request("a", [1, 2, 3, 4, 5], 9, output_token_ids=[], handoff_state=state)
        )
    with pytest.raises(InvalidRequestError, match="splitwise_role"):
        p.add_transferred(
            Request("a", [1, 2, 3, 4, 5], 9, output_token_ids=[3], handoff_state=state)
        )
    # the held blocks are out of circulation until released, and their id cannot be reused
    with pytest.raises(InvalidRequestError, match="still held"):
        p.add_requests([Request("a", [1, 2], max_tokens=2)])
    held = len(h.blocks)
    assert len(p.scheduler.free_blocks) == p.scheduler.total_blocks - held
    assert p.release_handoff("a") == held and p.release_handoff("a") == 0
    assert len(p.scheduler.free_blocks) == p.scheduler.total_blocks
    export_slot(d.runner.share_inputs, d.runner.proposer.model_inputs, 0)  # type: ignore[attr-defined]
    for e in (p, d, other, no_mtp):
        e.close()


def test_a_failed_transfer_fails_only_its_request_and_frees_its_blocks(random_model):
    target, mtp = random_model
    cfg = make_config(2, 2)
    p = build_engine(role_config(cfg, "prefill"), target, mtp)
    d = build_engine(role_config(cfg, "decode"), target, mtp)
    asked: list[tuple[Request, list[int]]] = []
    d.kv_fetcher = lambda req, blocks: asked.append((req, blocks))
    p.add_requests(
        [Request("ok", [5, 6, 7, 8], max_tokens=6), Request("bad", [9, 10, 11], max_tokens=6)]
    )
    handoffs = p.step(0).handed_off
    for h in handoffs:
        r = h.request
        d.add_transferred(
            Request(
                r.request_id,
                r.prompt_token_ids,
                r.max_tokens,
                output_token_ids=r.output_token_ids,
                handoff_state=h.state,
            )
        )
    d.step(0)
    assert {r.request_id for r, _ in asked} == {"ok", "bad"}
    by_id = {r.request_id: (r, b) for r, b in asked}
    bad, bad_blocks = by_id["bad"]
    # the client goes away while the transfer is in flight: the blocks stay held ...
    assert d.abort(bad, RuntimeError("client left"))
    assert d.scheduler.held["bad"] == bad_blocks
    d.transfer_done(bad, RuntimeError("late"))  # ... until the transfer ends
    assert "bad" not in d.scheduler.held
    ok, ok_blocks = by_id["ok"]
    for a, b in zip(p.runner.host_caches()[0], d.runner.host_caches()[0]):  # type: ignore[attr-defined]
        b[ok_blocks[: len(handoffs[0].blocks)]] = a[handoffs[0].blocks]
    d.transfer_done(ok)
    steps = 1
    while d.has_work:
        ev = d.step(steps)
        assert not ev.failed
        steps += 1
    assert len(ok.output_token_ids) == 6
    assert len(d.scheduler.free_blocks) == d.scheduler.total_blocks

    # a transfer that fails (the prefill instance died) aborts the request with that error
    p2 = build_engine(role_config(cfg, "prefill"), target, mtp)
    seeded = SamplingParams(seed=9)  # not derived from the request id: "y" below reuses the state
    p2.add_requests([Request("x", [1, 2, 3], max_tokens=5, sampling=seeded)])
    (h,) = p2.step(0).handed_off

    def transferred(request_id: str) -> Request:
        """The request `h` handed over, under `request_id`."""
        return Request(
            request_id,
            [1, 2, 3],
            5,
            output_token_ids=h.request.output_token_ids,
            handoff_state=h.state,
            sampling=seeded,
        )

    d.add_transferred(transferred("x"))
    d.step(steps)
    ((req, _),) = asked[2:]
    d.transfer_done(req, TimeoutError("prefill instance gone"))
    assert isinstance(req.error, TimeoutError) and req.finished
    assert not d.has_work and len(d.scheduler.free_blocks) == d.scheduler.total_blocks
    # without a kv_fetcher the request fails at admission, clearly
    d.kv_fetcher = None
    d.add_transferred(transferred("y"))
    ev = d.step(steps + 1)
    assert [r.request_id for r, _ in ev.failed] == ["y"] and "kv_fetcher" in str(ev.failed[0][1])
    assert len(d.scheduler.free_blocks) == d.scheduler.total_blocks
    for e in (p, p2, d):
        e.close()


@pytest.mark.parametrize("chunk", [0, 3, 7], ids=["whole", "chunk3", "chunk7"])
def test_seeded_sampling_with_penalties_through_prefill_and_decode_equals_mixed(
    random_model, chunk
):
    """The mixed engine prefills whole prompts; the prefill instance splits them into chunks
    of ``chunk`` tokens: the first token of a penalised request must not depend on it."""
    target, mtp = random_model
    cfg = make_config(3, 3, max_num_seqs=3)
    reqs = make_requests(5, 6, stagger=1)
    kinds = [
        SamplingParams(temperature=0.9, top_p=0.9, seed=1, presence_penalty=1.5),
        SamplingParams(
            temperature=1.0, top_k=10, seed=2, repetition_penalty=1.3, frequency_penalty=0.2
        ),
        SamplingParams(),
    ]
    for i, r in enumerate(reqs):
        r.sampling = kinds[i % 3]
    mixed = build_engine(cfg, target, mtp).generate([r.fresh_copy() for r in reqs])
    pd = LocalPD(cfg, target, mtp, fetch_delay=1, prefill_chunk_size=chunk)
    assert pd.run([r.fresh_copy() for r in reqs]) == mixed
    pd.close()


def test_ignore_eos_through_prefill_and_decode_equals_mixed(random_model):
    """``ignore_eos`` masks the EOS ids for the request's whole length on both instances (the
    slot's ``min_dec_len`` is its ``max_tokens``, within the hand-over's bounds). The EOS id is
    the token these requests generate most, so the others end early at it."""
    target, mtp = random_model
    reqs = make_requests(11, 4, stagger=1)
    plain = build_engine(make_config(2, 2, max_num_seqs=3), target, mtp).generate(
        [r.fresh_copy() for r in reqs]
    )
    counts = np.bincount([t for out in plain.values() for t in out])
    eos = int(counts.argmax())
    cfg = make_config(2, 2, max_num_seqs=3, eos=(eos,))
    for i, r in enumerate(reqs):
        r.sampling = SamplingParams(ignore_eos=i % 2 == 0)
    mixed = build_engine(cfg, target, mtp).generate([r.fresh_copy() for r in reqs])
    pd = LocalPD(cfg, target, mtp, fetch_delay=1)
    assert pd.run([r.fresh_copy() for r in reqs]) == mixed
    pd.close()
    for i, r in enumerate(reqs):
        out = mixed[r.request_id]
        if i % 2 == 0:
            assert len(out) == r.max_tokens and eos not in out
        else:
            assert eos not in out[:-1]
    assert any(mixed[r.request_id][-1] == eos for i, r in enumerate(reqs) if i % 2)


def test_a_decode_request_whose_sampling_differs_from_the_handed_over_slot_is_refused(random_model):
    target, mtp = random_model
    cfg = make_config(2, 2)
    p = build_engine(role_config(cfg, "prefill"), target, mtp)
    p.add_requests([Request("a", [1, 2, 3], 6, sampling=SamplingParams(temperature=0.7, seed=4))])
    (h,) = p.step(0).handed_off
    d = build_engine(role_config(cfg, "decode"), target, mtp)
    for other, word in (
        (SamplingParams(temperature=0.8, seed=4), "temperature"),
        (SamplingParams(temperature=0.7, seed=5), "seed"),
        (SamplingParams(temperature=0.7, seed=4, ignore_eos=True), "ignore_eos"),
    ):
        with pytest.raises(InvalidRequestError, match=f"`sampling`.*{word}"):
            d.add_transferred(
                Request(
                    "a",
                    [1, 2, 3],
                    6,
                    output_token_ids=h.request.output_token_ids,
                    handoff_state=h.state,
                    sampling=other,
                )
            )
    assert not d.has_work
    p.close()
    d.close()


@pytest.mark.parametrize(
    ("part", "name", "values", "word"),
    [
        ("target", "seq_lens_decoder", [-5], "outside"),
        ("target", "step_idx", [10**6], "outside"),
        ("draft", "seq_lens_this_time", [-1], "outside"),
        ("target", "draft_tokens", [3, 999], "token ids"),
        ("draft", "pre_ids", [-7], "token ids"),
        ("target", "max_dec_len", [-2], ">= 0"),
    ],
)
def test_a_hostile_slot_state_is_refused_before_it_reaches_a_step(
    random_model, part, name, values, word
):
    target, mtp = random_model
    cfg = make_config(2, 2)
    p = build_engine(role_config(cfg, "prefill"), target, mtp)
    p.add_requests([Request("a", [1, 2, 3], 6)])
    (h,) = p.step(0).handed_off
    state = json.loads(json.dumps(h.state))
    state[part][name]["v"] = values
    d = build_engine(role_config(cfg, "decode"), target, mtp)
    with pytest.raises(InvalidRequestError, match=f"{part}.{name}.*{word}"):
        d.add_transferred(
            Request(
                "a", [1, 2, 3], 6, output_token_ids=h.request.output_token_ids, handoff_state=state
            )
        )
    assert not d.has_work
    p.close()
    d.close()


# ---- the decode side's history check ----------------------------------------------------------


def _handoffs(cfg, target, mtp, reqs, **kwargs):
    """Every hand-over of an in-process P/D run as (prompt ids, first token ids, state, blocks),
    snapshotted when the prefill engine made it."""
    pd = LocalPD(cfg, target, mtp, **kwargs)
    seen = []
    step = pd.p.step

    def recording(s):
        ev = step(s)
        for h in ev.handed_off:
            r = h.request
            seen.append(
                (
                    list(r.prompt_token_ids),
                    list(r.output_token_ids),
                    json.loads(json.dumps(h.state)),
                    h.blocks,
                )
            )
        return ev

    pd.p.step = recording
    pd.run(reqs)
    pd.close()
    return seen


@pytest.mark.parametrize(
    ("k", "steps", "hybrid", "chunk"), [(0, 1, False, 0), (3, 3, False, 0), (3, 1, True, 4)]
)
def test_every_real_hand_over_passes_the_history_check_and_each_inconsistency_is_named(
    random_model, k, steps, hybrid, chunk
):
    """The invariants hold for every hand-over a prefill engine makes (prompts of 2..30 tokens,
    block boundaries, chunked prefill), and breaking any one of them is refused naming it."""
    from fastdeploy_mtp.splitwise.handoff import check_handoff_history

    target, mtp = random_model
    cfg = make_config(k, steps, hybrid, max_num_seqs=3)
    bs = cfg.cache_config.block_size
    reqs = make_requests(9, 6, stagger=1, min_prompt=2, max_prompt=3 * bs + 1)
    seen = _handoffs(cfg, target, mtp if k else None, reqs, prefill_chunk_size=chunk)
    assert len(seen) == len(reqs)
    for prompt, out, state, blocks in seen:
        check_handoff_history(state, prompt, out, len(blocks), bs, k)
    prompt, out, state, blocks = max(seen, key=lambda s: len(s[0]))
    draft_len = state["draft"]["seq_lens_decoder"] if k else {"v": [0], "fill": 0}
    cached = max(len(prompt), (draft_len["v"] or [draft_len["fill"]])[0])
    need = -(-cached // bs)  # the blocks holding every cached position (the engine may offer more)
    assert len(blocks) >= need

    def broken(part, name, value):
        bad = json.loads(json.dumps(state))
        bad[part][name] = {**bad[part][name], "v": [value]}
        return bad

    cases = [
        (
            broken("target", "seq_lens_decoder", 1000),
            prompt,
            out,
            len(blocks),
            "target.seq_lens_decoder",
        ),
        (broken("target", "step_idx", 1024), prompt, out, len(blocks), "target.step_idx"),
        (
            broken("target", "prompt_lens", len(prompt) - 1),
            prompt,
            out,
            len(blocks),
            "target.prompt_lens",
        ),
        (
            broken("target", "seq_lens_encoder", 5),
            prompt,
            out,
            len(blocks),
            "target.seq_lens_encoder",
        ),
        (
            broken("target", "seq_lens_this_time", k + 2),
            prompt,
            out,
            len(blocks),
            "target.seq_lens_this_time",
        ),
        (
            state,
            [prompt[0] ^ 1, *prompt[1:]],
            out,
            len(blocks),
            "does not start with the request's prompt",
        ),
        (state, prompt, [out[0] ^ 1], len(blocks), "continue with the request's first tokens"),
        (state, prompt[:-1], out, len(blocks), "target.prompt_lens"),
        (state, prompt, [], len(blocks), "`output_token_ids` is empty"),
        (state, prompt, out, need - 1, "which need"),
    ]
    if k:
        cases.append(
            (
                broken("draft", "seq_lens_decoder", len(prompt) + k + 1),
                prompt,
                out,
                len(blocks),
                "draft.seq_lens_decoder",
            )
        )
    for bad_state, p, o, n, message in cases:
        with pytest.raises(HandoffError, match=re.escape(message)):
            check_handoff_history(bad_state, p, o, n, bs, k)
