"""Sampling at T > 0 end to end on the shipped checkpoint.

* Seeded TARGET_MATCH: a request generates exactly the tokens it generates without
  speculation (and whatever the batch), with temperature, top-k, top-p, min-p, penalties,
  min_tokens and greedy requests mixed in one batch; logprobs equal within 1e-4.
* REJECTION: the distribution of the first two generated tokens equals the target's, by a
  chi-square test against the exact probabilities (computed from the model through the
  non-speculative engine's logprobs), failing at p < 1e-4, also where the second token is
  the one reaching ``max_tokens``, on two prompts; so does the token reaching ``max_tokens``
  6 given its prefix. The same test rejects the lossy TOPP.
* Stop strings and stop token ids inside accepted drafts end the output where the
  non-speculative run ends it; streamed pieces never carry text that is later taken back.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.engine_args import build_config, speculative_config
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.engine import Engine
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def engine(shipped, k=0, steps=1, hybrid=False, batch=8, strategy="target_match", detokenize=None):
    target, mtp, arch = shipped
    spec = speculative_config(k, steps if k else None, hybrid)
    spec.verify_strategy = strategy
    cfg = build_config(arch, spec, batch, 256)
    # every prompt prefills in one chunk, whatever the decode load: chunk boundaries move
    # float32 logits by ~1e-5 (prefill attention sums in another order), which is not what
    # these tests compare
    cfg.scheduler_config.max_num_batched_tokens = 4096
    return build_engine(cfg, target, mtp if k else None, detokenize=detokenize)


# A mix a serving batch may hold: sampled rows of several kinds, penalties, greedy rows.
MIX = [
    SamplingParams(temperature=0.8, top_p=0.9, seed=7, logprobs=3),
    SamplingParams(temperature=1.0, top_k=20, seed=11),
    SamplingParams(),  # greedy
    SamplingParams(temperature=0.6, min_p=0.05, seed=3, repetition_penalty=1.3, logprobs=0),
    SamplingParams(
        temperature=0.9, seed=5, frequency_penalty=0.5, presence_penalty=0.3, min_tokens=6
    ),
    SamplingParams(
        repetition_penalty=1.2, presence_penalty=0.5, logprobs=2
    ),  # greedy with penalties
]


def mixed_requests(n: int, max_tokens: int = 32) -> list[Request]:
    return [
        Request(
            f"r{i}",
            TOK.encode(DEMO_PROMPTS[i % len(DEMO_PROMPTS)][: 20 + 7 * (i % 5)]),
            max_tokens=max_tokens - (i % 3),
            sampling=SamplingParams.from_dict(MIX[i % len(MIX)].to_dict()),
        )
        for i in range(n)
    ]


def run(eng: Engine, reqs: list[Request]) -> tuple[dict[str, list[int]], dict[str, list]]:
    out = eng.generate(reqs)
    eng.close()
    return out, {r.request_id: r.output_logprobs for r in reqs}


@pytest.fixture(scope="module")
def reference(shipped):
    """Every request of the mix alone, without speculation (batch 1)."""
    outs, lps = {}, {}
    for req in mixed_requests(16):
        o, lp = run(engine(shipped, batch=1), [req])
        outs.update(o)
        lps.update(lp)
    return outs, lps


@pytest.fixture(scope="module")
def no_speculation(shipped):
    """The logprobs of the mix without speculation, per batch size."""
    cache: dict[int, dict[str, list]] = {}

    def get(batch: int) -> dict[str, list]:
        if batch not in cache:
            cache[batch] = run(engine(shipped, batch=batch), mixed_requests(16))[1]
        return cache[batch]

    return get


@pytest.mark.parametrize(
    ("k", "steps", "hybrid", "batch"),
    [
        (1, 1, False, 16),
        (2, 2, False, 5),
        (3, 3, False, 1),
        (3, 1, True, 16),
        (2, 1, False, 5),
        (0, 1, False, 16),
    ],
)
def test_seeded_target_match_equals_no_speculation_for_any_batch(
    shipped, reference, no_speculation, k, steps, hybrid, batch
):
    """Tokens: equal to each request alone without speculation (whatever the batch).
    Logprobs: equal within 1e-4 to the non-speculative run of the same batch size (batch
    composition moves float32 logits by ~1e-6 relative, which is not speculation's doing)."""
    eng = engine(shipped, k, steps, hybrid, batch)
    got, got_lp = run(eng, mixed_requests(16))
    assert got == reference[0]
    want_lp = no_speculation(batch)
    for rid, entries in want_lp.items():
        assert len(got_lp[rid]) == len(entries)
        for a, b in zip(got_lp[rid], entries):
            assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-4)
    if k:
        assert eng.metrics.accepted.sum() > 0, "drafts were accepted while sampling"


def test_the_sampled_requests_really_sample(shipped, reference):
    want, _ = reference
    plain = [Request(r.request_id, r.prompt_token_ids, r.max_tokens) for r in mixed_requests(16)]
    greedy, _ = run(engine(shipped, batch=16), plain)
    sampled = [r.request_id for r in mixed_requests(16) if not r.sampling.greedy]
    assert sum(greedy[r] != want[r] for r in sampled) >= len(sampled) - 2


def test_logprobs_describe_the_emitted_tokens(reference):
    _, lps = reference
    entries = lps["r0"]  # logprobs=3
    assert entries and all(len(e.top) == 3 for e in entries)
    for e in entries:
        assert e.logprob <= 0.0 and math.isfinite(e.logprob)
        values = [v for _, v in e.top]
        assert values == sorted(values, reverse=True) and e.logprob <= values[0] + 1e-6
        if e.token_id in dict(e.top):
            assert dict(e.top)[e.token_id] == pytest.approx(e.logprob, abs=1e-6)
    assert all(len(e.top) == 0 for e in lps["r3"])  # logprobs=0: the token's own only
    assert lps["r1"] == []  # none asked


# ---- REJECTION is lossless in distribution ---------------------------------------------------
def _chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_pre = -z + a * math.log(z) - math.lgamma(a)
    if z < a + 1:  # series for P, then Q = 1 - P
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-15 * abs(total):
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - math.exp(log_pre) * total)
    # continued fraction for Q (modified Lentz)
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(log_pre) * h


def test_chi2_survival_function_matches_known_values():
    assert _chi2_sf(3.841, 1) == pytest.approx(0.05, abs=2e-4)
    assert _chi2_sf(23.209, 10) == pytest.approx(0.01, abs=1e-4)
    assert _chi2_sf(10.0, 10) == pytest.approx(0.4405, abs=1e-3)


def _distributions(shipped, prompts: list[list[int]], sp: SamplingParams) -> list[dict[int, float]]:
    """The exact next-token distribution after each of ``prompts`` under ``sp`` (its top-k
    support), from the non-speculative engine's logprobs (log_softmax of the scaled logits)."""
    eng = engine(shipped, batch=32)
    wanted = SamplingParams.from_dict({**sp.to_dict(), "logprobs": sp.top_k})
    reqs = [
        Request(f"p{i}", p, max_tokens=1, sampling=SamplingParams.from_dict(wanted.to_dict()))
        for i, p in enumerate(prompts)
    ]
    eng.generate(reqs)
    eng.close()
    out = []
    for req in reqs:
        top = dict(req.output_logprobs[0].top)
        total = sum(math.exp(v) for v in top.values())
        out.append({t: math.exp(v) / total for t, v in top.items()})
    return out


#: top-k 6 at temperature 1: a support small enough for a joint chi-square over two tokens;
#: the model's <|endoftext|> masked (in the exact distribution too), so that every sample
#: has max_tokens tokens
TOP6 = SamplingParams(temperature=1.0, top_k=6, ignore_eos=True)
PROMPT_A = TOK.encode(DEMO_PROMPTS[2][:40])
PROMPT_B = TOK.encode(DEMO_PROMPTS[1][:30])  # a next-token distribution wide enough for df >= 5


def _sample(
    shipped, strategy: str, prompt: list[int], max_tokens: int, n: int
) -> tuple[list[list[int]], Engine]:
    """``n`` requests of ``prompt`` with seeds 0..n-1 through K = S = 3 MTP speculation."""
    eng = engine(shipped, 3, 3, batch=16, strategy=strategy)
    reqs = [
        Request(
            f"s{i}",
            prompt,
            max_tokens=max_tokens,
            sampling=SamplingParams.from_dict({**TOP6.to_dict(), "seed": i}),
        )
        for i in range(n)
    ]
    out = eng.generate(reqs)
    eng.close()
    return [out[r.request_id] for r in reqs], eng


def _chi2_p_value(observed: dict, expected_p: dict, n: int) -> tuple[float, int]:
    """Pearson's chi-square p-value of ``observed`` counts (``n`` in all) against the
    probabilities ``expected_p``, categories expecting fewer than 5 pooled; and its df."""
    expected = {c: n * p for c, p in expected_p.items()}
    big = [c for c, e in expected.items() if e >= 5]
    pooled_e = n - sum(expected[c] for c in big)
    pooled_o = n - sum(observed.get(c, 0) for c in big)
    stat = sum((observed.get(c, 0) - expected[c]) ** 2 / expected[c] for c in big)
    df = len(big) - 1
    if pooled_e >= 5:
        stat += (pooled_o - pooled_e) ** 2 / pooled_e
        df += 1
    return _chi2_sf(stat, df), df


def _first_two_tokens_p_value(
    shipped, strategy: str, prompt: list[int], max_tokens: int, n: int
) -> float:
    """Chi-square p-value of the joint distribution of the first two generated tokens against
    the exact one; every generated token must lie in the top-k support."""
    p1 = _distributions(shipped, [prompt], TOP6)[0]
    seconds = _distributions(shipped, [prompt + [a] for a in p1], TOP6)
    joint = {(a, b): pa * pb for (a, pa), p2 in zip(p1.items(), seconds) for b, pb in p2.items()}
    samples, eng = _sample(shipped, strategy, prompt, max_tokens, n)
    if max_tokens > 2 and strategy == "rejection":
        # the second token was decided by the verify op on real drafts: some accepted, some not
        m = eng.metrics
        assert m.proposed[0] >= n and 0 < m.accepted[0] < m.proposed[0]
    assert all(len(ids) == max_tokens for ids in samples)
    counts: dict[tuple[int, int], int] = {}
    for ids in samples:
        counts[(ids[0], ids[1])] = counts.get((ids[0], ids[1]), 0) + 1
    outside = set(counts) - set(joint)
    assert not outside, f"tokens outside the top-k support were generated: {sorted(outside)[:5]}"
    p_value, df = _chi2_p_value(counts, joint, n)
    assert df >= 5
    return p_value


@pytest.mark.parametrize(
    ("prompt", "max_tokens"),
    [(PROMPT_A, 6), (PROMPT_A, 2), (PROMPT_B, 2)],
    ids=["A-max6", "A-max2-last", "B-max2-last"],
)
def test_rejection_sampling_keeps_the_target_distribution_of_the_first_two_tokens(
    shipped, prompt, max_tokens
):
    """With ``max_tokens`` 2 the second token is the one reaching ``max_tokens``: the op
    would emit the end id there, were it not kept (``keep_max_dec_len_token``)."""
    p_value = _first_two_tokens_p_value(
        shipped, "rejection", prompt, max_tokens, 3000 if max_tokens > 2 else 2000
    )
    assert p_value >= 1e-4, p_value


def test_the_distribution_test_rejects_topp_which_is_lossy(shipped):
    """The same test has the power to fail: TOPP accepts any draft among the top-p
    candidates, so the MTP layer's greedy draft is over-represented at the second token."""
    p_value = _first_two_tokens_p_value(shipped, "topp", PROMPT_A, 6, 1500)
    assert p_value < 1e-4, p_value


def test_rejection_sampling_keeps_the_target_distribution_at_the_last_position(shipped):
    """The token reaching ``max_tokens`` 6, given whatever the first five were: its exact
    conditional distribution is computed per distinct prefix, and the randomized
    probability integral transform ``u = F(x-) + V p(x)`` (V uniform) of every sample must be
    uniform on [0, 1) (chi-square over 10 equal bins)."""
    n, max_tokens = 2000, 6
    samples, _ = _sample(shipped, "rejection", PROMPT_A, max_tokens, n)
    prefixes = sorted({tuple(ids[:-1]) for ids in samples})
    dists = dict(
        zip(prefixes, _distributions(shipped, [PROMPT_A + list(p) for p in prefixes], TOP6))
    )
    rng = np.random.default_rng(0)
    bins = np.zeros(10, np.int64)
    for ids in samples:
        dist = dists[tuple(ids[:-1])]
        last = ids[-1]
        assert last in dist, f"the last token {last} lies outside the top-k support {sorted(dist)}"
        below = sum(p for t, p in dist.items() if t < last)
        u = below + rng.random() * dist[last]
        bins[min(int(u * 10), 9)] += 1
    p_value, df = _chi2_p_value(
        {i: int(c) for i, c in enumerate(bins)}, {i: 0.1 for i in range(10)}, n
    )
    assert df == 9
    assert p_value >= 1e-4, (bins.tolist(), p_value)


# ---- stops inside accepted drafts ----------------------------------------------------------
def test_stop_strings_and_ids_inside_accepted_drafts_end_the_output_where_no_speculation_does(
    shipped,
):
    prompts = [TOK.encode(p) for p in DEMO_PROMPTS]
    greedy, _ = run(
        engine(shipped), [Request(f"g{i}", p, max_tokens=48) for i, p in enumerate(prompts)]
    )
    texts = {rid: TOK.decode([t for t in ids if t < 256]) for rid, ids in greedy.items()}

    def decode(ids: list[int]) -> str:
        return TOK.decode([t for t in ids if t < 256])

    def with_stops(k: int) -> tuple[dict[str, list[int]], Engine, list[Request], list[list[int]]]:
        eng = engine(shipped, k, k if k else 1, detokenize=decode)
        eng.trace = []
        reqs = [
            Request(
                f"g{i}",
                p,
                max_tokens=48,
                sampling=SamplingParams(stop=["self.", "):"], stop_token_ids=[ord("@")]),
            )
            for i, p in enumerate(prompts)
        ]
        eng.add_requests(reqs)
        pieces: dict[str, list[int]] = {r.request_id: [] for r in reqs}
        step = 0
        while eng.has_work:
            for req, tokens in eng.step(step).emitted:
                pieces[req.request_id].extend(tokens)
            step += 1
        eng.close()
        return (
            {r.request_id: r.output_token_ids for r in reqs},
            eng,
            reqs,
            [pieces[r.request_id] for r in reqs],
        )

    plain, _, _, _ = with_stops(0)
    spec, eng, reqs, streamed = with_stops(3)
    assert spec == plain
    cut_inside_a_run = 0
    for req, pieces in zip(reqs, streamed):
        text = texts[req.request_id]
        ends = [i for i in (text.find("self."), text.find("):")) if i >= 0]
        if ends:
            assert decode(req.output_token_ids) == text[: min(ends)] and req.finish_reason == "stop"
        assert pieces == req.output_token_ids, "handed-out tokens are never taken back"
    # some stop fell inside a run of accepted drafts: the request's last step emitted several
    # tokens and the output was cut among them
    for req in reqs:
        steps = [new for _, rid, task, new, _ in eng.trace or [] if rid == req.request_id]
        if (
            req.finish_reason == "stop"
            and len(steps[-1]) > 1
            and len(req.output_token_ids) < sum(map(len, steps))
        ):
            cut_inside_a_run += 1
    assert cut_inside_a_run > 0


def test_topp_verification_runs_and_reruns_identically(shipped):
    def once() -> dict[str, list[int]]:
        return run(engine(shipped, 3, 3, strategy="topp"), mixed_requests(6, 24))[0]

    first = once()
    assert first == once()
    assert all(len(v) >= 1 for v in first.values())


def test_greedy_verify_strategy_refuses_sampling(shipped):
    from fastdeploy_mtp.runtime.request import InvalidRequestError

    eng = engine(shipped, 3, 3, strategy="greedy")
    with pytest.raises(InvalidRequestError, match="temperature.*verify_strategy"):
        eng.add_requests([Request("a", [1, 2], 4, sampling=SamplingParams(temperature=0.5))])
    eng.close()


def test_sampling_params_are_checked_naming_the_field(shipped):
    from fastdeploy_mtp.runtime.request import InvalidRequestError

    eng = engine(shipped)
    for bad, field in [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"seed": -1}, "seed"),
        ({"logprobs": 21}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
        ({"temperature": float("nan")}, "temperature"),
    ]:
        with pytest.raises(InvalidRequestError) as exc:
            eng.add_requests([Request("a", [1, 2], 4, sampling=SamplingParams(**bad))])
        assert exc.value.field == field
    with pytest.raises(InvalidRequestError, match="detokenize"):
        eng.add_requests([Request("a", [1, 2], 4, sampling=SamplingParams(stop=["x"]))])
    assert not eng.has_work
    eng.close()


def test_extreme_parameters_stay_valid_and_a_tiny_temperature_is_greedy(shipped):
    prompt = TOK.encode("def f(x):")
    # every case runs to max_tokens: the model's <|endoftext|> is masked (ignore_eos)
    greedy, _ = run(
        engine(shipped, 3, 3), [Request("g", prompt, 20, sampling=SamplingParams(ignore_eos=True))]
    )
    cases = [
        SamplingParams(temperature=1e-7, seed=1),
        SamplingParams(temperature=1e6, seed=1),
        SamplingParams(temperature=1.0, top_k=10**9, top_p=1e-12, seed=3),
        SamplingParams(temperature=1.0, min_p=1.0, seed=4),
        SamplingParams(
            repetition_penalty=1e30, frequency_penalty=2.0, presence_penalty=-2.0, logprobs=20
        ),
        SamplingParams(
            temperature=0.5, repetition_penalty=1e-30, min_tokens=10**6, seed=2**63 - 1, logprobs=1
        ),
    ]
    for strategy in ("target_match", "rejection"):
        reqs = [
            Request(
                f"h{i}",
                prompt,
                20,
                sampling=SamplingParams.from_dict({**c.to_dict(), "ignore_eos": True}),
            )
            for i, c in enumerate(cases)
        ]
        out, lps = run(engine(shipped, 3, 3, strategy=strategy), reqs)
        for rid, ids in out.items():
            assert len(ids) == 20 and all(0 <= t < 256 for t in ids), (rid, ids)
            assert all(math.isfinite(e.logprob) for e in lps[rid])
        assert out["h0"] == greedy["g"]  # below 1e-5 the temperature is greedy
        # top-p that small, or min-p 1, keep the most likely token only: greedy too
        assert out["h2"] == greedy["g"] and out["h3"] == greedy["g"]
