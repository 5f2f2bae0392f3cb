"""The DeepSeek-V3-architecture checkpoint shipped in fastdeploy_mtp/assets_mla: it is a
released-layout folder that load_model reads, it is small, the card's held-out prefix score
reproduces, and its MTP layer drafts with a mean accepted length above 2.5 at K = 3 in the
reference engine."""

import json
import os

import pytest

from fastdeploy_mtp.models import ASSETS_DIR
from tests.support.models import load_shipped, rescore_heldout_prefix

MLA_ASSETS_DIR = os.path.join(os.path.dirname(ASSETS_DIR), "assets_mla")
#: The issue's floor for the mean accepted length at K = 3.
ACCEPTANCE_FLOOR = 2.5
#: Relative tolerance of the re-scored loss (same float32 computation; BLAS may differ).
REL_TOL = 0.01


@pytest.fixture(scope="module")
def shipped():
    return load_shipped(MLA_ASSETS_DIR)


def test_folder_is_small_and_released_deepseek_v3(shipped):
    total = sum(
        os.path.getsize(os.path.join(MLA_ASSETS_DIR, n)) for n in os.listdir(MLA_ASSETS_DIR)
    )
    assert total <= 6 * 1024 * 1024, f"assets_mla is {total} bytes"
    with open(os.path.join(MLA_ASSETS_DIR, "config.json"), encoding="utf-8") as f:
        raw = json.load(f)
    assert raw["architectures"] == ["DeepseekV3ForCausalLM"]
    _, mtp, config, _ = shipped
    assert config.attention_type == "mla" and config.n_routed_experts > 1 and mtp is not None
    assert config.is_moe_layer(config.num_hidden_layers)  # the MTP layer's block is MoE


def test_scoring_heldout_prefix_reproduces_card_loss(shipped):
    target, _, _, metrics = shipped
    loss = rescore_heldout_prefix(target, metrics)
    assert loss == pytest.approx(metrics["fixed_prefix_score"]["main_loss"], rel=REL_TOL)


def test_mean_accepted_length_at_k3_stays_above_floor(shipped):
    from fastdeploy_mtp.engine_args import speculative_config
    from fastdeploy_mtp.entrypoints.offline import run_prompts
    from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
    from fastdeploy_mtp.runtime.sampling_params import SamplingParams

    *_, metrics = shipped
    card = metrics["serving"]
    _, _, m = run_prompts(  # as the card measures it: every answer max_tokens long
        DEMO_PROMPTS,
        card["max_tokens"],
        speculative_config(card["k"], card["steps"]),
        1,
        "test",
        MLA_ASSETS_DIR,
        SamplingParams(ignore_eos=True),
    )
    assert card["k"] == 3
    assert m.mean_accepted_length >= ACCEPTANCE_FLOOR
    assert m.mean_accepted_length == pytest.approx(card["demo"]["mean_accepted_length"], abs=0.05)
    with open(os.path.join(MLA_ASSETS_DIR, "CARD.md"), encoding="utf-8") as f:
        assert f"{card['demo']['mean_accepted_length']:.2f}" in f.read()
