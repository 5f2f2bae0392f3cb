"""``fastdeploy-mtp check-drafts`` on a GLM-4.5 folder: equal drafts (exit 0), a folder whose
config asks for the position-0 mask transformers never applies (exit 1, the differing round
named), engine-only figures, and the refusal of a folder without MTP layers (exit 2)."""

from __future__ import annotations

import json

import pytest

from fastdeploy_mtp.entrypoints.cli import main
from tests.support import hf_folders, hf_moe_folders
from tests.support.tokenizer_files import write_bpe_tokenizer


def glm_folder(out, **options):
    """A GLM-4.5 folder (negative router bias, a 300-token BPE tokenizer); `options` go to
    :func:`hf_moe_folders.make_glm_folder`."""
    hf_moe_folders.make_glm_folder(
        out,
        negative_bias=True,
        tokenizer_writer=lambda o: write_bpe_tokenizer(str(o), 300),
        **options,
    )
    return out


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    return glm_folder(tmp_path_factory.mktemp("glm"), echo=True, seed=2)


def _check(capsys, *args):
    rc = main(["check-drafts", *args, "--max-tokens", "16", "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_equal_drafts_pass(glm, capsys):
    rc, report = _check(capsys, "--model", str(glm))
    assert rc == 0 and report["verdict"] == "drafts equal the reference in every round"
    assert report["reference"]["acceptance"] == report["ours"]["acceptance"]
    assert 0 < report["ours"]["acceptance"][0] < 1  # some drafts accepted, some rejected
    assert len(report["requests"]) == 6 and all(
        r["first_diff_round"] is None for r in report["requests"]
    )
    assert "before its final norm" in report["rule"]
    rc, report = _check(capsys, "--model", str(glm), "-k", "2", "--prompt", "def f(x):")
    assert (
        rc == 0
        and len(report["ours"]["acceptance"]) == 2
        and "chained (pre_norm)" in report["reference"]["source"]
    )


def test_a_wrong_convention_is_caught(tmp_path, capsys):
    """Random (not echoed) MTP weights: the mask moves the argmax of some rows."""
    masked = glm_folder(tmp_path / "masked", qk_norm=True, seed=3)
    cfg = json.loads((masked / "config.json").read_text())
    cfg["mtp_mask_first_position"] = True
    (masked / "config.json").write_text(json.dumps(cfg))
    rc, report = _check(capsys, "--model", str(masked))
    assert rc == 1 and report["verdict"] == "drafts DIFFER from the reference"
    diff = [r for r in report["requests"] if r["first_diff_round"] is not None]
    assert diff and all(
        r["tokens_equal"] for r in report["requests"]
    )  # the target hides bad drafts
    assert diff[0]["ours"]["drafts"] != diff[0]["reference"]["drafts"]


def test_engine_only_and_refusals(glm, tmp_path, capsys):
    rc, report = _check(capsys, "--model", str(glm), "--no-reference")
    assert rc == 0 and report["reference"] is None and report["verdict"] == "engine only"
    plain = tmp_path / "plain"
    hf_folders.make_folder(
        plain, "llama", num_mtp_layers=0, tokenizer_writer=lambda o: write_bpe_tokenizer(str(o))
    )
    assert main(["check-drafts", "--model", str(plain)]) == 2
    assert "no MTP layer" in capsys.readouterr().err
