"""One bad request must not poison the reference engine: submission is checked all or
nothing, a request that fails while it runs is aborted alone (slot and blocks freed) while the
others finish with the tokens they produce alone, and the engine stays usable after any error.
Runs on the shipped tiny checkpoint (greedy, deterministic)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.engine_args import build_config, speculative_config
from fastdeploy_mtp.models import ByteTokenizer, MTPLayer, TinyTargetModel, load_tiny
from fastdeploy_mtp.runtime.request import GenerationError, InvalidRequestError, Request
from tests.support.engines import make_config, tiny_arch

TOK = ByteTokenizer()
K, STEPS, SLOTS, MAX_LEN = 3, 3, 4, 96
GOOD_PROMPT = "def fib(n):\n    return"
LONG_PROMPT = "import os\nimport sys\n\nclass Foo:\n    pass"


@pytest.fixture(scope="module")
def shipped():
    return load_tiny()


def make_engine(shipped, k=K, chunk=0, max_len=MAX_LEN, slots=SLOTS, blocks=None):
    target, mtp, arch = shipped
    cfg = build_config(arch, speculative_config(k, min(STEPS, k) if k else None), slots, max_len)
    if blocks is not None:
        cfg.cache_config.total_block_num = blocks
    return build_engine(cfg, target, mtp if k else None, prefill_chunk_size=chunk)


def good(rid="good", max_tokens=16, prompt=GOOD_PROMPT):
    return Request(rid, TOK.encode(prompt), max_tokens=max_tokens)


@pytest.fixture(scope="module")
def alone(shipped):
    """Each prompt's greedy output when it runs alone on a fresh engine."""
    engine = make_engine(shipped)
    return {
        "good": engine.generate([good()])["good"],
        "long": engine.generate([good("long", 16, LONG_PROMPT)])["long"],
    }


def assert_idle(engine):
    """Nothing queued or running, every KV block free, every slot stopped."""
    sched = engine.scheduler
    assert not sched.waiting and not sched.slots
    assert sorted(sched.free_blocks) == list(range(engine.fd_config.cache_config.total_block_num))
    assert engine.runner.share_inputs.stop_flags.numpy().all()


# ---- 1. all or nothing ---------------------------------------------------------------------
def test_generate_with_one_invalid_request_queues_none_of_them(shipped, alone):
    engine = make_engine(shipped)
    ok, bad = good(), Request("bad", [1, 2, 300], max_tokens=4)
    with pytest.raises(
        InvalidRequestError, match=r"request 'bad': `prompt_token_ids\[2\]` = 300"
    ) as err:
        engine.generate([ok, bad])
    assert (err.value.request_id, err.value.field) == ("bad", "prompt_token_ids[2]")
    assert_idle(engine)
    assert not ok.submitted and ok.output_token_ids == []
    assert engine.generate([]) == {}  # `ok` was not left queued for the next call
    assert engine.generate([ok]) == {"good": alone["good"]}  # and can still be submitted


# ---- 2. a request failing mid-run -------------------------------------------------------------
@pytest.mark.parametrize("k", [3, 0])
def test_request_failing_mid_run_is_aborted_and_the_others_finish_as_alone(shipped, alone, k):
    """`bad` is corrupted after it was queued, in its second prompt chunk: it already holds a
    slot, KV blocks and draft state when the token would reach the model. (Greedy outputs do
    not depend on K, so the K = 3 reference serves both.)"""
    engine = make_engine(shipped, k=k, chunk=8)
    ok, bad = good(), good("bad", 16, LONG_PROMPT)
    engine.scheduler.add_request(ok)
    engine.scheduler.add_request(bad)
    bad.prompt_token_ids[12] = 999  # >= vocab
    with pytest.raises(GenerationError, match=r"'bad'.*`prompt_token_ids\[12\]` = 999") as err:
        engine.generate([])
    assert err.value.results == {"good": alone["good"]}
    assert set(err.value.failures) == {"bad"}
    assert isinstance(bad.error, InvalidRequestError) and bad.finished and ok.error is None
    assert_idle(engine)
    # not poisoned: the next call runs normally, in the slot the bad request held
    assert engine.generate([good("long", 16, LONG_PROMPT)]) == {"long": alone["long"]}


def test_error_inside_a_step_aborts_the_running_requests_and_the_queue_goes_on(shipped, alone):
    """An exception raised inside a step cannot be pinned on one request: the requests holding
    a slot are aborted with it, queued ones run afterwards, and the engine is reusable."""
    engine = make_engine(shipped, slots=1)
    runner = engine.runner
    model = runner.model

    class FailOnce:
        config, compute_logits, calls = model.config, model.compute_logits, 0

        def __call__(self, ids, meta):
            FailOnce.calls += 1
            if FailOnce.calls == 3:
                raise RuntimeError("device fault")
            return model(ids, meta)

    runner.model = FailOnce()
    first, second = good("first"), good("long", 16, LONG_PROMPT)
    with pytest.raises(GenerationError, match="device fault") as err:
        engine.generate([first, second])
    assert set(err.value.failures) == {"first"}
    assert err.value.results == {"long": alone["long"]}
    assert isinstance(first.error, RuntimeError)
    assert_idle(engine)
    assert engine.generate([good()]) == {"good": alone["good"]}


# ---- 3. token ids and duplicate ids ---------------------------------------------------------
@pytest.mark.parametrize(
    "ids,field",
    [
        ([5, -1, 7], "prompt_token_ids[1]"),
        ([-(2**40)], "prompt_token_ids[0]"),
        ([5, 6, 272], "prompt_token_ids[2]"),  # == vocab_size
        ([2**62], "prompt_token_ids[0]"),
        ([2**64], "prompt_token_ids"),  # not an int64
        ([1.5, 2.0], "prompt_token_ids"),
        ([[1, 2], [3, 4]], "prompt_token_ids"),
        ([[1], [2, 3]], "prompt_token_ids"),
        ("abc", "prompt_token_ids"),
        (np.array([1, 2], np.float32), "prompt_token_ids"),
    ],
)
def test_invalid_token_ids_are_refused_at_submission(shipped, ids, field):
    engine = make_engine(shipped)
    req = good()
    req.prompt_token_ids = ids
    with pytest.raises(InvalidRequestError, match="request 'good'") as err:
        engine.generate([req])
    assert err.value.field == field
    assert_idle(engine)


def test_every_token_id_below_vocab_size_is_accepted(shipped):
    engine = make_engine(shipped)
    out = engine.generate(
        [Request("edge", [0, 255, 256, 271], max_tokens=3)]
    )  # 256..271: padded ids
    assert len(out["edge"]) == 3


def test_duplicate_request_ids_are_refused(shipped, alone):
    engine = make_engine(shipped)
    with pytest.raises(InvalidRequestError, match="request 'good': `request_id` appears twice"):
        engine.generate([good(), good()])
    assert_idle(engine)
    queued, running = good(), good("long", 16, LONG_PROMPT)
    engine.scheduler.add_request(running)
    engine.scheduler.schedule(
        0, engine.runner.share_inputs.seq_lens_this_time.numpy()
    )  # takes a slot
    engine.scheduler.add_request(queued)
    with pytest.raises(InvalidRequestError, match="still running"):
        engine.generate([good("long")])
    with pytest.raises(InvalidRequestError, match="still queued"):
        engine.generate([good()])
    with pytest.raises(InvalidRequestError, match="still queued"):
        engine.scheduler.add_request(good())
    # the refusals left both originals where they were
    assert [s.request for s in engine.scheduler.slots.values()] == [running]
    assert list(engine.scheduler.waiting) == [queued]
    # reuse of an id after its request finished is fine
    engine2 = make_engine(shipped)
    assert engine2.generate([good()]) == {"good": alone["good"]}
    assert engine2.generate([good()]) == {"good": alone["good"]}


# ---- 4. resubmission -------------------------------------------------------------------------
def test_resubmitting_a_finished_request_is_refused(shipped, alone):
    engine = make_engine(shipped)
    req = good()
    first = engine.generate([req])
    assert first == {"good": alone["good"]}
    with pytest.raises(InvalidRequestError, match="already submitted.*fresh_copy"):
        engine.generate([req])
    assert req.output_token_ids == alone["good"]  # untouched by the refusal
    assert engine.generate([req.fresh_copy()]) == first  # no old tokens prepended


def test_request_built_with_outputs_is_refused(shipped):
    engine = make_engine(shipped)
    req = good()
    req.output_token_ids = [1, 2]
    with pytest.raises(InvalidRequestError, match="already submitted"):
        engine.generate([req])


# ---- 5. other ways one request could poison the engine -----------------------------------------
def _set(attr, value):
    def mutate(req):
        setattr(req, attr, value)

    return mutate


@pytest.mark.parametrize(
    "mutate,field,match",
    [
        (_set("max_tokens", 0), "max_tokens", "must be > 0"),
        (_set("max_tokens", -3), "max_tokens", "must be > 0"),
        (_set("max_tokens", 2.5), "max_tokens", "integer"),
        (_set("max_tokens", True), "max_tokens", "integer"),
        (_set("max_tokens", None), "max_tokens", "integer"),
        (_set("prompt_token_ids", []), "prompt_token_ids", "is empty"),
        (_set("prompt_token_ids", None), "prompt_token_ids", "sequence"),
        (_set("arrival_step", -1), "arrival_step", ">= 0"),
        (_set("arrival_step", 0.5), "arrival_step", "integer"),
        (_set("request_id", 7), "request_id", "must be a str"),
        (_set("prompt_token_ids", [65] * 100), "prompt_token_ids", "exceeds max_model_len"),
        (
            _set("prompt_token_ids", [65] * 93),
            "prompt_token_ids",
            "exceeds max_model_len",
        ),  # + 1 token too long
        (_set("max_tokens", 80), "max_tokens", "exceeds max_model_len"),
    ],
)
def test_invalid_request_fields_are_refused_at_submission(shipped, alone, mutate, field, match):
    engine = make_engine(shipped)
    req = good("bad")
    mutate(req)
    with pytest.raises(InvalidRequestError, match=match) as err:
        engine.generate([good(), req])
    assert err.value.field == field
    assert_idle(engine)
    assert engine.generate([good()]) == {"good": alone["good"]}


def test_request_constructor_refuses_empty_prompt_and_non_positive_max_tokens():
    with pytest.raises(ValueError, match="`prompt_token_ids` is empty"):
        Request("r", [])
    with pytest.raises(ValueError, match="`max_tokens` must be > 0"):
        Request("r", [1], max_tokens=0)


def test_something_that_is_not_a_request_is_refused(shipped):
    engine = make_engine(shipped)
    with pytest.raises(InvalidRequestError, match="not a Request but a dict"):
        engine.generate([good(), {"request_id": "x", "prompt_token_ids": [1]}])
    with pytest.raises(TypeError, match="sequence of Request"):
        engine.generate(good())
    assert_idle(engine)


def test_request_needing_more_kv_blocks_than_the_cache_is_refused(shipped):
    engine = make_engine(shipped, blocks=3)  # 48 tokens of KV for everything
    with pytest.raises(InvalidRequestError, match="KV blocks, more than the whole KV cache") as err:
        engine.generate([good("big", max_tokens=40)])
    assert err.value.field == "max_tokens"
    assert_idle(engine)


def test_requests_wait_for_kv_blocks_instead_of_running_out(shipped, alone):
    """With room for one request's worst case, requests are admitted one at a time (no
    OutOfBlocksError in the middle of a run) and still produce their tokens."""
    engine = make_engine(shipped, blocks=4)
    out = engine.generate([good(), good("long", 16, LONG_PROMPT)])
    assert out == {"good": alone["good"], "long": alone["long"]}
    assert_idle(engine)


def test_positions_beyond_the_models_rope_table_are_refused():
    """A model that encodes fewer positions than `max_model_len`: a request that would reach
    them is refused at submission; one exactly at the bound runs."""
    paddle.seed(7)
    arch = tiny_arch(num_hidden_layers=1, max_position_embeddings=40)
    target = TinyTargetModel(arch)
    mtp = MTPLayer(arch, target)
    engine = build_engine(make_config(3, steps=3, eos=(63,), max_model_len=96), target, mtp)
    with pytest.raises(InvalidRequestError, match=r"exceeds the model's max positions \(40\)"):
        engine.generate([Request("far", [1] * 10, max_tokens=27)])  # 10 + 27 + K + 1 = 41
    out = engine.generate([Request("edge", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], max_tokens=26)])  # = 40
    assert len(out["edge"]) == 26
    assert_idle(engine)


def test_max_steps_exhausted_aborts_everything_and_the_engine_stays_usable(shipped, alone):
    engine = make_engine(shipped, slots=1)
    a, b = good("a"), good("b")
    with pytest.raises(GenerationError, match="did not finish within 3 engine steps") as err:
        engine.generate([a, b], max_steps=3)
    assert set(err.value.failures) == {"a", "b"} and err.value.results == {}
    assert_idle(engine)
    assert engine.generate([good()]) == {"good": alone["good"]}


def test_arrival_step_at_or_past_max_steps_is_refused_and_late_arrivals_do_not_spin(shipped, alone):
    engine = make_engine(shipped)
    with pytest.raises(InvalidRequestError, match="not below `max_steps`"):
        engine.generate(
            [Request("late", TOK.encode(GOOD_PROMPT), max_tokens=16, arrival_step=50)], max_steps=50
        )
    late = Request("good", TOK.encode(GOOD_PROMPT), max_tokens=16, arrival_step=900_000)
    assert engine.generate([late]) == {"good": alone["good"]}  # idle steps are skipped, not spun


def test_progress_callback_error_propagates_and_leaves_the_engine_empty(shipped, alone):
    engine = make_engine(shipped, slots=1)

    def boom(done, total):
        raise KeyError("progress")

    reqs = [good("a"), good("b")]
    with pytest.raises(KeyError, match="progress"):
        engine.generate(reqs, progress=boom)
    assert reqs[1].finished and isinstance(reqs[1].error, KeyError)
    assert_idle(engine)
    assert engine.generate([good()]) == {"good": alone["good"]}
