"""Structured output composed with speculative drafting (:mod:`fastdeploy_mtp.runtime.guided`).

On the shipped tiny byte model, offline:

* JSON-schema, regex, choice and JSON-object constraints give conforming outputs that end
  with EOS (finish reason ``"stop"``) when the grammar is complete;
* the output under a constraint is the same with MTP speculation (K=3, S=3), with the hybrid
  MTP + n-gram drafts and without speculation, greedy and seeded (temperature 0.8);
* the MTP layer drafts under the grammar (no MTP draft is ever cut; each substep's mask
  follows the round's earlier drafts, and the matchers roll back after the round); drafts
  that do not see the grammar (the hybrid's n-gram part, ``ngram``, ``suffix``) are cut
  before verification: the metrics count them, and every draft that reached verification
  (the engine's trace) is valid after the output before it;
* after a rejection the matcher is at "output so far" and each logit row gets the mask of
  its own position (unit tests on :class:`~fastdeploy_mtp.runtime.guided.GuidedSlots`);
* bad constraints are refused at submission, naming the field.
"""

from __future__ import annotations

import json
import re

import numpy as np
import paddle
import pytest
from llguidance import LLMatcher

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.constants import PLACEHOLDER_TOKEN_ID
from fastdeploy_mtp.engine_args import build_config, speculative_config
from fastdeploy_mtp.models import ASSETS_DIR, load_tiny
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.engine import Engine
from fastdeploy_mtp.runtime.grammar import grammar_of
from fastdeploy_mtp.runtime.guided import GuidedSlots
from fastdeploy_mtp.runtime.request import (
    GenerationError,
    InvalidRequestError,
    Request,
    RequestType,
)
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from tests.support.guided_cases import EOS, SCHEMA, TOK, V

REGEX = r"[0-9]{3}-[a-z]{2,5}"
CHOICES = ["def", "class", "import os"]
CONSTRAINTS = {
    "json": {"kind": "json", "spec": SCHEMA},
    "regex": {"kind": "regex", "spec": REGEX},
    "choice": {"kind": "choice", "spec": CHOICES},
    "object": {"kind": "json_object", "spec": None},
}
SEEDED = {"temperature": 0.8, "seed": 11}
SPECS = {"none": (0, 1, False), "mtp_k3_s3": (3, 3, False), "hybrid_k3_s1": (3, 1, True)}


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def engine(shipped, k: int, steps: int, hybrid: bool) -> Engine:
    target, mtp, arch = shipped
    cfg = build_config(arch, speculative_config(k, steps if k else None, hybrid), 8, 256)
    cfg.scheduler_config.max_num_batched_tokens = 4096  # every prompt in one chunk
    cfg.model_config.model = ASSETS_DIR  # whose tokenizer.json the grammars run on
    return build_engine(cfg, target, mtp if k else None, record_trace=True)


def text_of(ids: list[int]) -> str:
    return bytes(t for t in ids if t < 256).decode("utf-8")


def requests(sampling: dict) -> list[Request]:
    return [
        Request(
            f"{name}-{i}",
            TOK.encode(DEMO_PROMPTS[i][:30]),
            max_tokens=60,
            sampling=SamplingParams(guided=guided, **sampling),
        )
        for name, guided in CONSTRAINTS.items()
        for i in range(2)
    ]


def check_conforms(req: Request) -> None:
    """``req``'s whole output is valid under its constraint; a JSON schema, regex or choice
    ends at EOS (finish reason ``"stop"``) and parses/matches (any JSON object may run to
    ``max_tokens`` on this model)."""
    matcher = GuidedSlots(ASSETS_DIR, V, [EOS]).matcher(req.sampling.guided)
    out = req.output_token_ids
    assert matcher.validate_tokens(out) == len(out), (req.request_id, out)
    kind = req.request_id.split("-")[0]
    if kind == "object" and req.finish_reason == "length":
        return
    assert req.finish_reason == "stop" and out[-1] == EOS, (req.request_id, out)
    text = text_of(out[:-1])
    if kind == "json":
        value = json.loads(text)
        assert set(value) == {"name", "n", "ok"}
        assert isinstance(value["name"], str) and len(value["name"]) <= 8
        assert type(value["n"]) is int and 0 <= value["n"] <= 99 and type(value["ok"]) is bool
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES
    else:
        assert isinstance(json.loads(text), dict)


@pytest.fixture(scope="module")
def runs(shipped):
    """``(spec, sampling) -> (outputs, engine)`` for every speculation and sampling mode."""
    out = {}
    for spec_name, (k, steps, hybrid) in SPECS.items():
        for mode, sampling in (("greedy", {}), ("seeded", SEEDED)):
            eng = engine(shipped, k, steps, hybrid)
            reqs = requests(sampling)
            eng.generate(reqs)
            eng.close()
            out[spec_name, mode] = (reqs, eng)
    return out


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_outputs_conform_to_their_constraint_and_end_with_stop(runs, mode):
    for spec_name in SPECS:
        for req in runs[spec_name, mode][0]:
            check_conforms(req)


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_speculation_does_not_change_a_constrained_output(runs, mode):
    plain = {r.request_id: r.output_token_ids for r in runs["none", mode][0]}
    for spec_name in ("mtp_k3_s3", "hybrid_k3_s1"):
        reqs, eng = runs[spec_name, mode]
        assert {r.request_id: r.output_token_ids for r in reqs} == plain, spec_name
        assert eng.metrics.accepted.sum() > 0, "speculation should gain something under a grammar"


def test_seeded_sampling_differs_from_greedy_under_a_grammar(runs):
    greedy = [r.output_token_ids for r in runs["none", "greedy"][0]]
    assert [r.output_token_ids for r in runs["none", "seeded"][0]] != greedy


def verified_drafts_are_valid(eng: Engine, reqs: list[Request]) -> int:
    """Replays the trace: every draft verified for a constrained request is grammar-valid after
    the output before it. Returns how many drafts were checked."""
    by_id = {r.request_id: r for r in reqs}
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    emitted: dict[str, list[int]] = {}
    checked = 0
    assert eng.trace is not None
    for _, rid, task, new, drafts in eng.trace:
        so_far = emitted.setdefault(rid, [])
        offered = [d for d in drafts if d != PLACEHOLDER_TOKEN_ID]
        if task == "DECODE" and offered:
            matcher = slots.matcher(by_id[rid].sampling.guided)
            assert matcher.consume_tokens(so_far)
            assert matcher.validate_tokens(offered) == len(offered), (rid, text_of(so_far), offered)
            checked += len(offered)
        so_far.extend(new)
    return checked


@pytest.mark.parametrize("spec", [(3, 3, False), (3, 1, True)], ids=["mtp_k3_s3", "hybrid_k3_s1"])
def test_mtp_drafts_follow_the_grammar_and_grammar_blind_drafts_are_cut(shipped, spec):
    """The MTP layer drafts under each slot's grammar: with K = S = 3 no draft is ever cut and
    every checked draft reaches verification. The hybrid's n-gram drafts (positions 2..3) do
    not see the grammar: some are cut. Either way the output is that of plain decoding."""
    # the model drafts English text after these prompts; the grammar wants digits
    outputs, metrics = {}, {}
    for name, k_s_h in (("plain", (0, 1, False)), ("spec", spec)):
        eng = engine(shipped, *k_s_h)
        reqs = [
            Request(
                f"d{i}",
                TOK.encode(DEMO_PROMPTS[i][:40]),
                40,
                sampling=SamplingParams(guided={"kind": "regex", "spec": "[0-9 ]{30}"}),
            )
            for i in range(3)
        ]
        eng.generate(reqs)
        eng.close()
        outputs[name], metrics[name] = [r.output_token_ids for r in reqs], eng.metrics
    assert outputs["spec"] == outputs["plain"]
    m = metrics["spec"]
    assert m.guided_drafts_checked > 0 and m.guided_rounds > 0 and m.guided_seconds > 0.0
    if spec[2]:
        assert m.guided_drafts_cut > 0
    else:
        assert m.guided_drafts_cut == 0 and m.accepted.sum() > 0
    # what was cut never reached the target: verified = checked - cut
    assert (
        verified_drafts_are_valid(eng, reqs)
        == m.guided_drafts_checked - m.guided_drafts_cut
        == m.proposed.sum()
    )
    for req in reqs:
        assert (
            re.fullmatch("[0-9 ]{30}", text_of(req.output_token_ids[:-1]))
            and req.finish_reason == "stop"
        )


def test_verified_drafts_are_grammar_valid_in_every_run(runs):
    for spec_name in ("mtp_k3_s3", "hybrid_k3_s1"):
        for mode in ("greedy", "seeded"):
            reqs, eng = runs[spec_name, mode]
            assert verified_drafts_are_valid(eng, reqs) == eng.metrics.proposed.sum() > 0
    for mode in (
        "greedy",
        "seeded",
    ):  # the MTP layer drafts under the grammar: K = S = 3 has nothing to cut
        assert runs["mtp_k3_s3", mode][1].metrics.guided_drafts_cut == 0


def test_a_prompt_prefilled_in_chunks_gives_the_same_constrained_output(shipped, runs):
    """Non-final chunks' throw-away rows are neither masked nor advance the matcher."""
    target, mtp, arch = shipped
    cfg = build_config(arch, speculative_config(3, 3, False), 8, 256)
    cfg.model_config.model = ASSETS_DIR
    eng = build_engine(cfg, target, mtp, prefill_chunk_size=7)
    reqs = requests({})
    eng.generate(reqs)
    eng.close()
    want = {r.request_id: r.output_token_ids for r in runs["mtp_k3_s3", "greedy"][0]}
    assert {r.request_id: r.output_token_ids for r in reqs} == want


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_model_free_drafts_are_cut_by_the_grammar_and_change_no_output(shipped, runs, method):
    """The n-gram and suffix drafters never see the grammar either: their drafts are cut the
    same way, and the constrained output equals the non-speculative one, greedy and seeded."""
    target, _, arch = shipped
    spec = SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": 3})
    for mode, sampling in (("greedy", {}), ("seeded", SEEDED)):
        cfg = build_config(arch, spec, 8, 256)
        cfg.scheduler_config.max_num_batched_tokens = 4096
        cfg.model_config.model = ASSETS_DIR
        eng = build_engine(cfg, target, None, record_trace=True)
        reqs = requests(sampling)
        eng.generate(reqs)
        eng.close()
        want = {r.request_id: r.output_token_ids for r in runs["none", mode][0]}
        assert {r.request_id: r.output_token_ids for r in reqs} == want, (method, mode)
        m = eng.metrics
        assert m.guided_drafts_checked > 0, (method, mode)
        assert verified_drafts_are_valid(eng, reqs) == m.guided_drafts_checked - m.guided_drafts_cut
        assert verified_drafts_are_valid(eng, reqs) == m.proposed.sum()


# ---- GuidedSlots units -----------------------------------------------------------------------
def reference_mask(guided: dict, consumed: list[int]) -> np.ndarray:
    """``[V]`` bool: what a fresh matcher allows after ``consumed``."""
    matcher = GuidedSlots(ASSETS_DIR, V, [EOS]).matcher(guided)
    assert matcher.consume_tokens(consumed)
    bits = np.frombuffer(matcher.compute_bitmask(), np.uint8)
    return np.unpackbits(bits, bitorder="little")[:V].astype(bool)


def mask_of(masks: np.ndarray, row: int) -> np.ndarray:
    return np.unpackbits(masks[row : row + 1].view(np.uint8), bitorder="little")[:V].astype(bool)


def test_after_a_rejection_the_matcher_is_at_the_output_so_far():
    guided = {"kind": "regex", "spec": "(ab|ac)[0-9]+x"}
    a, b, c, one, z = (ord(ch) for ch in "abc1z")
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    slots.start(1, guided, [a])  # the output so far: "a"
    enc = np.zeros(3, np.int64)
    # slot 1 decodes [a] with drafts b, 1, z: "ab1" is valid, 'z' is not
    drafts = np.full([3, 4], PLACEHOLDER_TOKEN_ID, np.int64)
    drafts[1] = [a, b, one, z]
    limits = slots.prepare(drafts, np.array([0, 4, 0]), enc, set())
    assert limits is not None and limits.tolist() == [3, 2, 3]  # 'z' cut; the other slots keep K
    stats = slots.stats  # this step's work so far
    assert (stats.checked, stats.cut) == (3, 1)
    # one mask per row: row i is the state after drafts 1..i
    for row, consumed in enumerate([[a], [a, b], [a, b, one]]):
        assert (mask_of(slots.masks[1], row) == reference_mask(guided, consumed)).all(), row
    # the target rejects draft 'b' and emits 'c': the matcher must be at "ac", not "ab1"
    accept = np.full([3, 4], PLACEHOLDER_TOKEN_ID, np.int64)
    accept[1, 0] = c
    slots.advance(accept, np.array([0, 1, 0]))
    slots.prepare(np.full([3, 4], PLACEHOLDER_TOKEN_ID, np.int64), np.array([0, 1, 0]), enc, set())
    got = mask_of(slots.masks[1], 0)
    assert (got == reference_mask(guided, [a, c])).all()
    assert got[one] and not got[b] and not got[ord("x")]


def test_rows_after_a_partial_acceptance_match_a_fresh_matcher():
    guided = {"kind": "regex", "spec": "(ab|ac)[0-9]+x"}
    a, b, one, two, x = (ord(ch) for ch in "ab12x")
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    slots.start(0, guided)
    enc = np.zeros(1, np.int64)
    # the final prefill chunk: one row, the state before any output
    slots.prepare(
        np.full([1, 4], PLACEHOLDER_TOKEN_ID, np.int64), np.array([5]), np.array([5]), set()
    )
    assert (mask_of(slots.masks[0], 0) == reference_mask(guided, [])).all()
    slots.advance(np.array([[a, -1, -1, -1]]), np.array([1]))
    # drafts b, 1, 2 are valid; the target accepts 'b', rejects '1' and emits '2'
    slots.prepare(np.array([[a, b, one, two]]), np.array([4]), enc, set())
    assert slots.stats.cut == 0
    slots.advance(np.array([[b, two, -1, -1]]), np.array([2]))
    slots.prepare(np.array([[two, x, -1, -1]]), np.array([2]), enc, set())
    for row, consumed in enumerate([[a, b, two], [a, b, two, x]]):
        assert (mask_of(slots.masks[0], row) == reference_mask(guided, consumed)).all(), row
    # after "ab2x" the grammar is complete: only EOS
    assert np.nonzero(mask_of(slots.masks[0], 1))[0].tolist() == [EOS]


def test_each_logit_row_gets_its_own_slots_mask():
    """Rows of a constrained slot between unconstrained ones: the masks land on the right rows."""
    guided = {"kind": "choice", "spec": ["ab", "cd"]}
    a, b, c = ord("a"), ord("b"), ord("c")
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    slots.start(1, guided)
    slots.prepare(
        np.array([[0, -1], [9, a], [0, -1]]), np.array([2, 2, 2]), np.array([2, 0, 2]), set()
    )
    # rows: slot 0 (prefill, 1 row), slot 1 (2 rows: before and after draft 'a'), slot 2 (prefill)
    logits = paddle.zeros([4, V], dtype="float32")
    out = slots.apply(logits, np.array([0, 1, 1, 2]), np.array([0, 0, 1, 0])).numpy()
    assert np.isfinite(out[0]).all() and np.isfinite(out[3]).all()
    assert np.nonzero(np.isfinite(out[1]))[0].tolist() == [a, c]
    assert np.nonzero(np.isfinite(out[2]))[0].tolist() == [b]


def test_draft_masks_follow_the_round_and_the_matchers_roll_back():
    """Substep masks of constrained draft rows (between an unconstrained slot and a padding
    row): each after the round's earlier drafts; an EOS draft or a complete grammar closes a
    chain (its later drafts dropped); at the end every matcher is back at the output so far."""
    regex = {"kind": "regex", "spec": "(ab|ac)[0-9]x"}
    choice = {"kind": "choice", "spec": ["ok", "okay"]}
    a, b, k, o, one, x, z = (ord(ch) for ch in "abko1xz")
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    slots.start(0, choice, [o])
    slots.start(2, regex, [a])
    slt = paddle.to_tensor([1, 1, 1], dtype="int32")  # rows 0..2 = slots 0..2; row 3 is padding
    logits = paddle.zeros([4, V], dtype="float32")
    # per substep: (choice's consumed drafts or None once closed, regex's likewise, drafts of
    # rows 0..3)
    rounds = [
        ([o], [a], [k, z, b, 0]),
        ([o, k], [a, b], [EOS, z, one, 0]),
        (None, [a, b, one], [z, z, x, 0]),
    ]
    rounds.append((None, None, [z, z, z, 0]))  # "ab1x" is complete: the regex chain closed
    for choice_seen, regex_seen, drafts in rounds:
        out = np.isfinite(slots.mask_drafts(logits, slt).numpy())
        assert out[1].all() and out[3].all()
        for row, guided, seen in ((0, choice, choice_seen), (2, regex, regex_seen)):
            assert (out[row] == (reference_mask(guided, seen) if seen else True)).all(), (row, seen)
        slots.take_drafts(paddle.to_tensor(drafts, dtype="int64"))
    got: list[np.ndarray] = []
    target = type("Target", (), {"draft_tokens": paddle.zeros([3, 5], dtype="int64")})
    slots.end_drafts(target, lambda t, limits: got.append(limits))
    assert [g.tolist() for g in got] == [[2, 4, 3]]  # "k" + EOS; slot 1 keeps K; "b1x"
    slots.prepare(
        np.full([3, 1], PLACEHOLDER_TOKEN_ID, np.int64),
        np.array([1, 0, 1]),
        np.zeros(3, np.int64),
        set(),
    )
    assert (mask_of(slots.masks[0], 0) == reference_mask(choice, [o])).all()
    assert (mask_of(slots.masks[2], 0) == reference_mask(regex, [a])).all()
    assert slots.stats.seconds > 0.0


def test_a_complete_grammar_emits_eos_even_where_the_model_never_scores_it():
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    slots.start(0, {"kind": "choice", "spec": ["ok"]}, [ord("o"), ord("k")])
    slots.prepare(np.array([[ord("k")]]), np.array([1]), np.array([0]), set())
    logits = paddle.to_tensor(
        np.concatenate([np.zeros([1, 256]), np.full([1, 16], -np.inf)], axis=1).astype("float32")
    )
    out = slots.apply(logits, np.array([0]), np.array([0])).numpy()
    assert int(out.argmax()) == EOS and np.isfinite(out[0]).sum() == 1


def test_padded_ids_are_never_allowed():
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    slots.start(0, {"kind": "regex", "spec": "(.|\n)*"})
    slots.prepare(np.array([[0]]), np.array([3]), np.array([3]), set())
    allowed = mask_of(slots.masks[0], 0)
    assert allowed[:128].all() and not allowed[EOS + 1 :].any() and allowed[EOS]


def test_choice_strings_with_quotes_and_backslashes_compile_verbatim():
    choices = ['say "hi"', "back\\slash", "tab\there"]
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    for text in choices:
        m = slots.matcher({"kind": "choice", "spec": choices})
        ids = list(text.encode())
        assert m.validate_tokens(ids + [EOS]) == len(ids) + 1, text
    assert LLMatcher.validate_grammar(grammar_of({"kind": "choice", "spec": choices})) == ""


@pytest.mark.parametrize(
    "guided, why",
    [
        ({"kind": "regex", "spec": "[0-9"}, "regex"),
        ({"kind": "json", "spec": {"type": "frob"}}, "frob"),
        ({"kind": "choice", "spec": []}, "non-empty"),
        ({"kind": "grammar", "spec": "start: nope"}, "nope"),
        ({"kind": "xml", "spec": "<a/>"}, "kind"),
        ({"kind": "regex", "spec": "a", "extra": 1}, "kind"),
    ],
)
def test_a_bad_constraint_is_refused_at_submission_naming_the_field(shipped, guided, why):
    eng = engine(shipped, 3, 3, False)
    req = Request("bad", TOK.encode("x = "), 8, sampling=SamplingParams(guided=guided))
    with pytest.raises(InvalidRequestError) as info:
        eng.generate([req])
    eng.close()
    assert info.value.field == "guided" and why in str(info.value)


def test_without_a_model_folder_a_constrained_request_fails_alone(shipped):
    target, mtp, arch = shipped
    eng = build_engine(
        build_config(arch, speculative_config(3, 3, False), 8, 256), target, mtp
    )  # model_config.model unset
    guided = Request(
        "g",
        TOK.encode("x = "),
        8,
        sampling=SamplingParams(guided={"kind": "regex", "spec": "[0-9]+"}),
    )
    plain = Request("p", TOK.encode("x = "), 8)
    with pytest.raises(GenerationError) as info:
        eng.generate([guided, plain])
    eng.close()
    error = info.value.failures["g"]
    assert (
        isinstance(error, InvalidRequestError)
        and error.field == "guided"
        and "model_config.model" in str(error)
    )
    assert list(info.value.results) == ["p"] and len(info.value.results["p"]) == 8


def test_an_import_rebuilds_the_matcher_from_the_handed_over_tokens():
    guided = {"kind": "regex", "spec": "[a-c]{2}[0-9]+"}
    slots = GuidedSlots(ASSETS_DIR, V, [EOS])
    req = Request("h", [1, 2], 8, sampling=SamplingParams(guided=guided))
    req.task_type, req.idx, req.output_token_ids = RequestType.IMPORT, 2, [ord("a"), ord("b")]
    slots.check_task(req)
    slots.load(req)
    slots.prepare(
        np.full([3, 1], PLACEHOLDER_TOKEN_ID, np.int64),
        np.array([0, 0, 1]),
        np.zeros(3, np.int64),
        set(),
    )
    assert (mask_of(slots.masks[2], 0) == reference_mask(guided, [ord("a"), ord("b")])).all()
    req.output_token_ids = [ord("a"), ord("z")]  # not what the grammar allows
    with pytest.raises(InvalidRequestError) as info:
        slots.check_task(req)
    assert info.value.field == "guided" and "do not match" in str(info.value)


def test_sampling_params_carry_the_constraint_through_their_dict():
    sp = SamplingParams(temperature=0.5, guided={"kind": "json", "spec": SCHEMA})
    again = SamplingParams.from_dict(json.loads(json.dumps(sp.to_dict())))
    assert again == sp and again.check() is None


def test_a_bpe_model_folder_with_multi_byte_tokens(tmp_path):
    """A byte-level BPE tokenizer (merged and partial-character tokens, special tokens, a
    padded vocabulary): the constrained output matches, ends at EOS, and is the same with
    and without speculation."""
    from fastdeploy_mtp.config import SpeculativeConfig
    from fastdeploy_mtp.entrypoints.offline import run_requests
    from fastdeploy_mtp.tokenization import load_tokenizer
    from tests.support.hf_folders import make_folder
    from tests.support.tokenizer_files import write_bpe_tokenizer

    make_folder(
        tmp_path, "qwen3", num_mtp_layers=1, vocab_size=320, tokenizer_writer=write_bpe_tokenizer
    )
    pattern = "(café|naïve|日本語) [0-9]{2}"
    sampling = SamplingParams(guided={"kind": "regex", "spec": pattern})
    outs = []
    for spec in ('{"method": null}', '{"method": "mtp", "num_speculative_tokens": 3}'):
        reqs, texts, _ = run_requests(
            ["The quick brown fox"],
            40,
            SpeculativeConfig.from_json(spec),
            2,
            "offline",
            str(tmp_path),
            sampling,
        )
        assert re.fullmatch(pattern, texts[0]) and reqs[0].finish_reason == "stop", texts
        outs.append(reqs[0].output_token_ids)
    assert outs[0] == outs[1]
    tok = load_tokenizer(str(tmp_path))
    assert any(len(tok.token_bytes(t)) > 1 for t in outs[0]), "merged tokens should be used"


def test_the_grammar_ends_an_output_before_min_tokens_and_max_tokens_cuts_it(shipped):
    # a complete grammar allows only EOS; min_tokens bans EOS with a finite value (-1e10), so
    # EOS is still the only candidate: the output ends at the grammar's end, not with garbage
    eng = engine(shipped, 3, 3, False)
    choice = {"kind": "choice", "spec": ["yes", "no"]}
    early = Request(
        "min", TOK.encode("x"), max_tokens=20, sampling=SamplingParams(guided=choice, min_tokens=12)
    )
    cut = Request(
        "cut",
        TOK.encode(DEMO_PROMPTS[0][:30]),
        max_tokens=4,
        sampling=SamplingParams(guided=CONSTRAINTS["json"]),
    )
    eng.generate([early, cut])
    eng.close()
    out = early.output_token_ids
    assert (
        early.finish_reason == "stop" and out[-1] == EOS and text_of(out[:-1]) in ("yes", "no")
    ), out
    # max_tokens mid-grammar: finish reason "length", the output a valid prefix of the grammar
    assert cut.finish_reason == "length" and len(cut.output_token_ids) == 4
    assert (
        GuidedSlots(ASSETS_DIR, V, [EOS])
        .matcher(CONSTRAINTS["json"])
        .validate_tokens(cut.output_token_ids)
        == 4
    )
