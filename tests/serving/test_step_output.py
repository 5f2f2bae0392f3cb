"""What a served step returns: the serving engine's ``RemoteRunner.execute`` (the step run by a
worker process) gives the engine the same :class:`~fastdeploy_mtp.runtime.target_runner.StepOutput`
as the in-process runner, including ``decode_mask`` (the slots that decoded, not prefill) and
``num_tokens`` (tokens in the target forward), which the worker's step reply carries."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from tests.support.servers import remote_runner

#: not adaptive: adaptive draft lengths follow the measured step times, which differ between runs
SPEC = (
    '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1, '
    '"mtp_strategy": "with_ngram"}'
)
K = 3
SLOTS = 4
MAX_MODEL_LEN = 256
CHUNK = 16  # prompt tokens per request and step: prompts take several steps, beside decoding slots
ARRIVALS = (0, 0, 1, 3, 6, 9)
MAX_TOKENS = 10


def requests() -> list[Any]:
    from fastdeploy_mtp.models import ByteTokenizer
    from fastdeploy_mtp.runtime.request import Request

    tok = ByteTokenizer()
    return [
        Request(f"r{i}", tok.encode(p), max_tokens=MAX_TOKENS, arrival_step=a)
        for i, (p, a) in enumerate(zip(DEMO_PROMPTS, ARRIVALS))
    ]


def run(engine: Any) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Every step's ``StepOutput`` fields (as lists) and the generated ids of :func:`requests`."""
    steps: list[dict[str, Any]] = []
    execute = engine.runner.execute

    def recording() -> Any:
        out = execute()
        steps.append(
            {
                "decode_mask": np.asarray(out.decode_mask, bool).tolist(),
                "num_tokens": int(out.num_tokens),
                "accept_num": np.asarray(out.accept_num).tolist(),
                "drafts": np.asarray(out.drafts).tolist(),
                "stop_flags": np.asarray(out.stop_flags, bool).tolist(),
            }
        )
        return out

    engine.runner.execute = recording
    results = engine.generate(requests(), max_steps=500)
    return steps, results


@pytest.fixture(scope="module")
def in_process() -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.config import SpeculativeConfig
    from fastdeploy_mtp.engine_args import build_config
    from fastdeploy_mtp.models import load_tiny

    target, mtp, arch = load_tiny()
    cfg = build_config(arch, SpeculativeConfig.from_json(SPEC), SLOTS, MAX_MODEL_LEN)
    with build_engine(cfg, target, mtp, prefill_chunk_size=CHUNK) as engine:
        return run(engine)


def test_a_served_step_reports_decode_slots_and_forward_tokens_as_the_in_process_runner(in_process):
    from fastdeploy_mtp.assembly import build_engine

    with remote_runner(SPEC, SLOTS, MAX_MODEL_LEN) as runner:
        engine = build_engine(runner.fd_config, runner=runner, prefill_chunk_size=CHUNK)
        served, served_results = run(engine)
    expected, expected_results = in_process
    assert served_results == expected_results
    # the comparison below means something: some steps mix prompt chunks with decoding slots (a
    # decoding slot feeds at most K + 1 tokens: more in the forward means a chunk), and a
    # forward's tokens are not the tokens it emitted
    assert any(
        any(s["decode_mask"]) and s["num_tokens"] > sum(s["decode_mask"]) * (K + 1)
        for s in expected
    ), "no step mixes prompt chunks with decoding slots"
    assert any(s["num_tokens"] != sum(s["accept_num"]) for s in expected)
    assert len(served) == len(expected)
    for field in ("decode_mask", "num_tokens", "accept_num", "drafts", "stop_flags"):
        for i, (got, want) in enumerate(zip(served, expected)):
            assert got[field] == want[field], f"step {i}: {field}"
