"""The model config's JSON is checked once, before any layer is built: unknown keys, wrong
types and out-of-range values are refused with a ValueError naming the key."""

from __future__ import annotations

import pytest

from fastdeploy_mtp.models.model_config import ModelConfig


def test_a_default_config_round_trips():
    cfg = ModelConfig()
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "values, message",
    [
        ({"hidden_size": "128"}, "'hidden_size' must be an integer, got \"128\""),
        ({"num_hidden_layers": True}, "'num_hidden_layers' must be an integer, got true"),
        ({"attention_bias": 1}, "'attention_bias' must be true or false, got 1"),
        ({"mtp_hidden_state": 3}, "'mtp_hidden_state' must be a string, got 3"),
        ({"rope_theta": "1e4"}, "'rope_theta' must be a number"),
        ({"hidden_size": 0}, "`hidden_size` must be positive, got 0"),
        ({"mtp_concat_order": "sideways"}, "`mtp_concat_order` must be one of"),
        (
            {"architectures": ["X"], "hidden": 3},
            "unknown ModelConfig fields: ['architectures', 'hidden']",
        ),
    ],
)
def test_bad_values_are_refused_by_key(values, message):
    with pytest.raises(ValueError) as err:
        ModelConfig.from_dict(values)
    assert message in str(err.value)


def test_an_integer_is_taken_for_a_float():
    cfg = ModelConfig.from_dict({"rms_norm_eps": 1, "rope_theta": 500000})
    assert cfg.rms_norm_eps == 1.0 and cfg.rope_theta == 500000.0
