"""``scripts/make_hf_folder.py`` builds every family of the model-folder table (tiny shapes,
random weights), and the engine loads each folder it writes, MTP layer included; its
``--help`` says the weights are random and ends its sentences."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")  # the builders are transformers' own classes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "make_hf_folder.py"


def _script():
    spec = importlib.util.spec_from_file_location("make_hf_folder", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT_MODULE = _script()

#: --family -> the ``architectures`` entry of the folder it writes
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mimo": "MiMoForCausalLM",
    "deepseek-v3": "DeepseekV3ForCausalLM",
    "glm-4.5": "Glm4MoeForCausalLM",
    "ernie-4.5": "Ernie4_5ForCausalLM",
    "ernie-4.5-moe": "Ernie4_5_MoeForCausalLM",
    "qwen3-next": "Qwen3NextForCausalLM",
    "qwen3.5": "Qwen3_5ForCausalLM",
}


def test_every_family_of_the_table_is_offered():
    assert set(SCRIPT_MODULE.ALL_FAMILIES) == set(ARCHITECTURES)


@pytest.mark.parametrize("family", list(ARCHITECTURES))
def test_each_family_is_written_and_loads_with_its_mtp_layer(tmp_path, family, capsys):
    import json

    from fastdeploy_mtp.models import load_model
    from fastdeploy_mtp.tokenization import load_tokenizer

    out = tmp_path / family
    assert SCRIPT_MODULE.main(["--family", family, "--out", str(out), "--tokenizer"]) == 0
    assert "random weights" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[family]]
    target, mtp, arch = load_model(out)
    assert mtp is not None and arch.num_nextn_predict_layers == 1
    assert load_tokenizer(str(out)).vocab_size <= arch.vocab_size


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--family", "deepseek-v3", "--rope-type", "yarn"], "--rope-type"),
        (["--family", "glm-4.5", "--tie"], "--tie"),
        (["--family", "ernie-4.5", "--dtype", "bfloat16"], "--dtype"),
        (["--family", "llama", "--mtp-layers", "-1"], "--mtp-layers"),
    ],
)
def test_an_option_the_family_does_not_take_is_refused(tmp_path, capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        SCRIPT_MODULE.main([*argv, "--out", str(tmp_path / "x")])
    assert exc.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_help_says_the_weights_are_random_and_ends_its_sentences():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "RANDOM weights" in text and "not a model" in text
    description = text.split("options:")[0]
    assert description.rstrip().endswith("200"), description  # the last example, whole
