"""MoE (:class:`MoEMLP`) against a numpy reference of the routing, and GLM-4.5 folders
(``Glm4MoeForCausalLM``: partial rotary, MoE layers, an MoE MTP layer without a position-0
embedding mask) against transformers: target logits, greedy tokens through our paged path,
MTP logits, K=1 acceptance round for round, TP slices and refusals.

The folders are tiny random checkpoints written by transformers
(tests/support/hf_moe_folders.py); the references are transformers' float32 outputs.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import paddle
import pytest
import transformers  # noqa: F401  (a test dependency: the comparison must run, never skip)

from fastdeploy_mtp.models import (
    moe as moe_module,
)
from fastdeploy_mtp.models.folder_inspection import inspect_model_folder
from fastdeploy_mtp.models.hf_config import UnsupportedModelError
from fastdeploy_mtp.models.layers import apply_rope
from fastdeploy_mtp.models.model_config import ModelConfig
from fastdeploy_mtp.models.moe import MoEMLP
from fastdeploy_mtp.models.parallel_layers import shard_axes
from tests.support import folder_checks, hf_moe_folders as glm
from tests.support.engines import check_k1_rounds_against_transformers
from tests.support.folder_checks import prefill, relative_error

PROMPT = [5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200, 33, 1, 77, 150, 9, 260, 31]
RTOL = 1e-4

# ---- MoEMLP against a numpy reference --------------------------------------------------------


def moe_config(**overrides) -> ModelConfig:
    fields = dict(
        hidden_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32,
        n_routed_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=8, n_shared_experts=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True, scoring_func="sigmoid",
        topk_method="noaux_tc",
    )  # fmt: skip
    fields.update(overrides)
    return ModelConfig(**fields)


def randomized(config: ModelConfig, seed: int = 0, tensor_parallel_size: int = 1) -> MoEMLP:
    """An MoEMLP with seeded values (correction bias large enough to change choices)."""
    layer = MoEMLP(config, tensor_parallel_size)
    rng = np.random.default_rng(seed)
    for name, p in sorted(layer.named_parameters()):
        scale = 0.3 if name.endswith("e_score_correction_bias") else 1.0 / np.sqrt(p.shape[0])
        p.set_value(paddle.to_tensor((scale * rng.standard_normal(p.shape)).astype(np.float32)))
    return layer


def numpy_route(
    config: ModelConfig, w: dict[str, np.ndarray], x: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(weights [T, k], experts [T, k]) token by token, straight from the routing's definition."""
    e, k, g = config.n_routed_experts, config.num_experts_per_tok, config.n_group
    logits = x.astype(np.float64) @ w["gate.weight"]
    if config.scoring_func == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        z = np.exp(logits - logits.max(-1, keepdims=True))
        scores = z / z.sum(-1, keepdims=True)
    weights, chosen = [], []
    for s in scores:
        biased = (
            s + w["gate.e_score_correction_bias"] if config.topk_method == "noaux_tc" else s.copy()
        )
        if config.topk_method != "greedy":
            groups = biased.reshape(g, e // g)
            if config.topk_method == "noaux_tc":
                group_score = np.sort(groups, axis=-1)[:, -2:].sum(-1)
            else:
                group_score = groups.max(-1)
            kept = np.argsort(-group_score, kind="stable")[: config.topk_group]
            allowed = np.zeros(e, bool)
            for grp in kept:
                allowed[grp * (e // g) : (grp + 1) * (e // g)] = True
            biased = np.where(allowed, biased, -np.inf)
        top = np.argsort(-biased, kind="stable")[:k]
        wt = s[top]
        if config.norm_topk_prob:
            wt = wt / (wt.sum() + 1e-20)
        weights.append(wt * config.routed_scaling_factor)
        chosen.append(top)
    return np.array(weights), np.array(chosen)


def numpy_moe(config: ModelConfig, layer: MoEMLP, x: np.ndarray) -> np.ndarray:
    w = {n: p.numpy().astype(np.float64) for n, p in layer.named_parameters()}
    w.setdefault("gate.e_score_correction_bias", np.zeros(config.n_routed_experts))

    def swiglu(prefix: str, v: np.ndarray) -> np.ndarray:
        gate, up = v @ w[prefix + "gate_proj.weight"], v @ w[prefix + "up_proj.weight"]
        return (gate / (1.0 + np.exp(-gate)) * up) @ w[prefix + "down_proj.weight"]

    weights, chosen = numpy_route(config, w, x)
    out = np.zeros(x.shape, np.float64)
    for t in range(x.shape[0]):
        for j in range(config.num_experts_per_tok):
            out[t] += (
                weights[t, j]
                * swiglu(f"experts.{chosen[t, j]}.", x[t : t + 1].astype(np.float64))[0]
            )
    if config.n_shared_experts:
        out += swiglu("shared_experts.", x.astype(np.float64))
    return out


ROUTINGS = {
    "noaux_tc-groups": dict(),
    "noaux_tc-one-group-no-norm": dict(
        n_group=1, topk_group=1, norm_topk_prob=False, routed_scaling_factor=1.0
    ),
    "greedy-softmax-norm": dict(
        scoring_func="softmax", topk_method="greedy", n_group=1, topk_group=1
    ),
    "greedy-softmax-no-shared": dict(
        scoring_func="softmax", topk_method="greedy", n_shared_experts=0
    ),
    "group_limited_greedy": dict(
        scoring_func="softmax", topk_method="group_limited_greedy", norm_topk_prob=False
    ),
    "top3-two-shared": dict(num_experts_per_tok=3, n_shared_experts=2, n_group=2, topk_group=1),
}


@pytest.mark.parametrize("case", sorted(ROUTINGS))
@paddle.no_grad()
def test_moe_matches_numpy_routing(case):
    config = moe_config(**ROUTINGS[case])
    layer = randomized(config, seed=len(case))
    x = np.random.default_rng(1).standard_normal((23, 16)).astype(np.float32)
    want = numpy_moe(config, layer, x)
    got = layer(paddle.to_tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    dense = layer.forward_dense(paddle.to_tensor(x.reshape(1, 23, 16))).numpy()
    np.testing.assert_allclose(dense[0], got, rtol=1e-6, atol=1e-6)
    assert ("shared_experts.gate_proj.weight" in dict(layer.named_parameters())) == (
        config.n_shared_experts > 0
    )
    biased = "gate.e_score_correction_bias" in dict(layer.named_parameters())
    assert biased == (config.topk_method == "noaux_tc")


@paddle.no_grad()
def test_correction_bias_changes_the_choice_but_not_the_weights():
    config = moe_config()
    layer = randomized(config, seed=3)
    x = paddle.to_tensor(np.random.default_rng(2).standard_normal((64, 16)).astype(np.float32))
    weights, chosen = (t.numpy() for t in layer.gate(x))
    bias = layer.gate.e_score_correction_bias
    saved = bias.numpy()
    bias.set_value(paddle.zeros_like(bias))
    unbiased = layer.gate(x)[1].numpy()
    bias.set_value(paddle.to_tensor(saved))
    assert (np.sort(chosen, -1) != np.sort(unbiased, -1)).any()  # the bias steers the choice
    w = {n: p.numpy().astype(np.float64) for n, p in layer.named_parameters()}
    want_weights, want_chosen = numpy_route(config, w, x.numpy())
    np.testing.assert_array_equal(np.sort(chosen, -1), np.sort(want_chosen, -1))
    order, want_order = np.argsort(chosen, -1), np.argsort(want_chosen, -1)
    got_w = np.take_along_axis(weights, order, -1)
    np.testing.assert_allclose(got_w, np.take_along_axis(want_weights, want_order, -1), rtol=1e-5)


@paddle.no_grad()
def test_no_tokens_give_an_empty_output():
    layer = randomized(moe_config())
    assert list(layer(paddle.zeros([0, 16])).shape) == [0, 16]
    assert list(layer.forward_dense(paddle.zeros([2, 0, 16])).shape) == [2, 0, 16]


@paddle.no_grad()
def test_tensor_parallel_partial_sums_add_up_to_the_full_block(monkeypatch):
    """Each rank holds every expert's slice along the intermediate dimension; the ranks'
    outputs before the one all-reduce sum to the unsharded block's output."""
    config = moe_config()
    full = randomized(config)
    params = dict(full.named_parameters())
    monkeypatch.setattr(moe_module.distributed, "all_reduce_sum", lambda y: y)
    x = paddle.to_tensor(np.random.default_rng(4).standard_normal((9, 16)).astype(np.float32))
    total = np.zeros((9, 16), np.float32)
    for rank in range(2):
        shard = MoEMLP(config, tensor_parallel_size=2)
        for name, p in shard.named_parameters():
            whole = params[name].numpy()
            axis = shard_axes(shard).get(name)
            if axis is not None:
                whole = np.split(whole, 2, axis=axis)[rank]
            p.set_value(paddle.to_tensor(whole))
        total += shard(x).numpy()
    np.testing.assert_allclose(total, full(x).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        MoEMLP(moe_config(moe_intermediate_size=6), tensor_parallel_size=4)


@paddle.no_grad()
def test_partial_rotary_rotates_the_first_dims_only():
    x = paddle.to_tensor(np.random.default_rng(5).standard_normal((3, 2, 8)).astype(np.float32))
    angle = np.random.default_rng(6).standard_normal((3, 2)).astype(np.float32)
    cos = paddle.to_tensor(np.cos(np.concatenate([angle, angle], -1)))
    sin = paddle.to_tensor(np.sin(np.concatenate([angle, angle], -1)))
    got = apply_rope(x, cos, sin).numpy()
    xs = x.numpy()
    np.testing.assert_array_equal(got[..., 4:], xs[..., 4:])
    np.testing.assert_allclose(
        got[..., :4], apply_rope(x[..., :4], cos, sin).numpy(), rtol=0, atol=0
    )
    c, s = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    np.testing.assert_allclose(
        got[..., :2], xs[..., :2] * c - xs[..., 2:4] * s, rtol=1e-6, atol=1e-6
    )


# ---- GLM-4.5 folders against transformers --------------------------------------------------

#: (case id, make_glm_folder kwargs): q/k norm with attention biases, and neither with values
#: reshaped so that K=1 drafts are accepted in some rounds (``echo``).
CASES = {
    "qknorm-bias": dict(qk_norm=True, bias=True),
    "plain-echo": dict(qk_norm=False, bias=False, seed=2, echo=True),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def folder(request, tmp_path_factory):
    return glm.make_glm_folder(tmp_path_factory.mktemp(request.param), **CASES[request.param])


def test_config_translates_glm_keys(folder, loaded):
    target, mtp, config = loaded
    assert config.model_type == "glm4_moe" and config.attention_type == "gqa"
    assert (config.partial_rotary_factor, config.head_dim) == (0.5, 32)
    assert (config.qk_norm, config.attention_bias) == (
        folder.config["use_qk_norm"],
        folder.config["attention_bias"],
    )
    assert (
        config.n_routed_experts,
        config.num_experts_per_tok,
        config.n_group,
        config.topk_group,
    ) == (8, 2, 2, 1)
    assert (config.routed_scaling_factor, config.norm_topk_prob, config.first_k_dense_replace) == (
        2.5,
        True,
        1,
    )
    assert (config.scoring_func, config.topk_method, config.mtp_final_norm) == (
        "sigmoid",
        "noaux_tc",
        "in_logits",
    )
    assert not config.mtp_mask_first_position and mtp is not None
    assert not isinstance(target.layers[0].mlp, MoEMLP)
    assert all(isinstance(layer.mlp, MoEMLP) for layer in target.layers[1:])
    assert isinstance(mtp.mtp_block.mlp, MoEMLP)  # MTP layer k is decoder layer N + k


@paddle.no_grad()
def test_target_logits_and_greedy_tokens_match_transformers(folder, loaded):
    target, _, _ = loaded
    folder_checks.assert_target_matches_transformers(
        target, prefill(target, PROMPT), folder.path, PROMPT, RTOL
    )


@paddle.no_grad()
def test_mtp_logits_match_transformers_without_position_zero_mask(folder, loaded):
    _, mtp, _ = loaded
    hidden = glm.reference_hidden(folder.path, [PROMPT])[0][:-1]
    next_ids = PROMPT[1:]
    want = glm.reference_mtp_logits(folder.path, [next_ids], hidden[None])[0]
    got = mtp.compute_logits(prefill(mtp, next_ids, hidden)).numpy()
    assert relative_error(got, want) <= RTOL
    # the same argmax wherever the reference's best two logits are apart by more than the error
    top2 = np.sort(want, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 10 * RTOL * np.abs(want).max()
    assert clear[1:].all() and (got.argmax(-1) == want.argmax(-1))[clear].all()
    mtp.config.mtp_mask_first_position = True
    try:
        masked = mtp.compute_logits(prefill(mtp, next_ids, hidden)).numpy()
    finally:
        mtp.config.mtp_mask_first_position = False
    assert np.abs(masked[0] - want[0]).max() > 1e-2  # the check can see the mask


@paddle.no_grad()
def test_k1_acceptance_round_for_round_equals_reference(folder, loaded):
    want, engine = check_k1_rounds_against_transformers(
        loaded, folder.path, PROMPT[:7], 16, folder.echo
    )
    # what `generate --json` reports as metrics.mean_accepted_length: the reference's rounds' mean
    decode = want[1:]  # the first round is the prefill's token
    assert engine.metrics.mean_accepted_length == pytest.approx(
        sum(map(len, decode)) / len(decode), rel=1e-12
    )


def test_tensor_parallel_ranks_hold_their_expert_slices(folder, loaded):
    full, full_mtp, _ = loaded
    folder_checks.assert_two_ranks_hold_their_expert_slices(folder.path, full, full_mtp)


#: (config.json key, bad value, what the one-line refusal says)
BAD_KEYS = [
    ("n_routed_experts", "8", "`n_routed_experts` must be an integer"),
    ("num_experts_per_tok", 9, "`num_experts_per_tok` (9) must be <= `n_routed_experts` (8)"),
    ("n_group", 3, "`n_group` (3) must divide `n_routed_experts` (8)"),
    ("topk_group", 3, "`topk_group` (3) must be <= `n_group` (2)"),
    ("n_group", 8, "leaves groups of one expert"),
    ("moe_intermediate_size", 0, "`moe_intermediate_size` must be >= 1"),
    ("routed_scaling_factor", -1.0, "`routed_scaling_factor` must be a number > 0"),
    ("norm_topk_prob", "yes", "`norm_topk_prob` must be true or false"),
    ("scoring_func", "relu", "`scoring_func` 'relu' is not supported"),
    ("topk_method", "top_p", "`topk_method` 'top_p' is not supported"),
    ("use_qk_norm", 1, "`use_qk_norm` must be true or false"),
    ("partial_rotary_factor", 1.5, "`partial_rotary_factor` must be a number in (0, 1]"),
]


@pytest.mark.parametrize(
    "key, value, message", BAD_KEYS, ids=[f"{k}={v!r}" for k, v, _ in BAD_KEYS]
)
def test_bad_moe_and_glm_keys_are_refused_naming_the_key(folder, tmp_path, key, value, message):
    bad = tmp_path / "bad"
    shutil.copytree(folder.path, bad)
    config = json.loads((bad / "config.json").read_text())
    config[key] = value
    if key == "partial_rotary_factor":
        config["rope_parameters"].pop("partial_rotary_factor")
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as info:
        inspect_model_folder(bad)
    text = str(info.value)
    assert message in text and str(bad) in text and "\n" not in text


def test_partial_rotary_is_refused_outside_glm(tmp_path):
    """Only the GLM-4.5 family rotates part of each head; elsewhere the key is refused."""
    from tests.support import hf_folders

    info = hf_folders.make_folder(
        tmp_path / "llama", "llama", num_mtp_layers=0, num_hidden_layers=1
    )
    config = json.loads((info.path / "config.json").read_text())
    config["rope_parameters"]["partial_rotary_factor"] = 0.5
    (info.path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="partial_rotary_factor"):
        inspect_model_folder(info.path)
