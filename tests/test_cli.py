"""The ``fastdeploy-mtp`` command line: --version, --json output, --speculative-config (parsing,
equivalence with the shorthand flags, conflicts), --plot, and the error contract (one line on
stderr, exit status 2 for a bad argument, 1 for a failure while running, 130 on Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fastdeploy_mtp
from fastdeploy_mtp.config import SpeculativeConfig, SpeculativeConfigError
from fastdeploy_mtp.engine_args import (
    DEFAULT_SPECULATIVE_CONFIG,
    UsageError,
    default_model,
    default_speculative_config,
    resolve_speculative_config,
)
from fastdeploy_mtp.entrypoints import cli, demo, demo_sweep, generate
from fastdeploy_mtp.entrypoints.cli import build_parser, main
from fastdeploy_mtp.runtime.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[1]
PROMPT = "def fib(n):\n    "


def run_main(capsys, *argv):
    """``main(argv)`` in-process: (exit status, stdout, stderr)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def error_line(err: str) -> str:
    """The single ``fastdeploy-mtp: error:`` line of ``err`` (asserts there is exactly one and
    no traceback)."""
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("fastdeploy-mtp: error:")]
    assert len(lines) == 1, err
    return lines[0]


def resolve(*argv):
    args = build_parser().parse_args(["generate", "--prompt", "x", *map(str, argv)])
    return resolve_speculative_config(args)


# ---- --version ---------------------------------------------------------------------------
def test_version(capsys):
    rc, out, _ = run_main(capsys, "--version")
    assert rc == 0
    assert out == f"fastdeploy-mtp {cli.package_version()}\n"
    assert out.split()[1][0].isdigit()


def test_version_falls_back_to_the_module_attribute(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert cli.package_version() == fastdeploy_mtp.__version__


# ---- SpeculativeConfig.from_json / from_dict ---------------------------------------------
def test_from_json_reads_fastdeploy_keys():
    spec = SpeculativeConfig.from_json(
        '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1, "mtp_strategy": '
        '"with_ngram", "max_ngram_size": 4, "min_ngram_size": 1, "verify_strategy": "greedy", '
        '"model": "/m"}'
    )
    assert spec == SpeculativeConfig("mtp", 3, 1, "with_ngram", 4, 1, "/m", "greedy")


@pytest.mark.parametrize(
    "values,steps",
    [
        ({"num_speculative_tokens": 3}, 3),
        ({"num_speculative_tokens": 3, "mtp_strategy": "with_ngram"}, 1),
        ({}, 1),
    ],
)
def test_missing_num_model_steps_defaults_to_k_or_1_with_ngram(values, steps):
    assert SpeculativeConfig.from_dict(values).num_model_steps == steps


@pytest.mark.parametrize("method", [None, "none"])
def test_method_null_or_none_disables_speculation(method):
    spec = SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": 3})
    assert spec.method is None and not spec.enabled


@pytest.mark.parametrize(
    "text,names",
    [
        (
            '{"method": "mtp", "num_spec_tokens": 3}',
            ["'num_spec_tokens'", "known keys: method, num_speculative_tokens"],
        ),
        ('{"num_speculative_tokens": "3"}', ["'num_speculative_tokens'", "integer", '"3"']),
        ('{"num_speculative_tokens": true}', ["'num_speculative_tokens'", "integer", "true"]),
        ('{"num_model_steps": 1.5}', ["'num_model_steps'", "integer", "1.5"]),
        ('{"mtp_strategy": 1}', ["'mtp_strategy'", "string"]),
        ('{"method": 3}', ["'method'", "string or null"]),
        ('{"method": "eagle"}', ["method", "'eagle'"]),
        ('{"mtp_strategy": "ngram_first"}', ["mtp_strategy", "'ngram_first'"]),
        ('{"verify_strategy": "beam"}', ["verify_strategy", "'beam'"]),
        (
            '{"num_speculative_tokens": 2, "num_model_steps": 3}',
            ["num_model_steps (3)", "num_speculative_tokens (2)"],
        ),
        ('{"num_speculative_tokens": 0}', ["num_speculative_tokens", "> 0"]),
        ('{"method": "mtp",}', ["not valid JSON", "line 1 column"]),
        ("[3]", ["JSON object", "list"]),
        ("", ["not valid JSON"]),
    ],
)
def test_from_json_errors_are_one_line_naming_the_key(text, names):
    with pytest.raises(SpeculativeConfigError) as info:
        SpeculativeConfig.from_json(text)
    message = str(info.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_from_dict_refuses_a_non_mapping():
    with pytest.raises(SpeculativeConfigError, match="JSON object"):
        SpeculativeConfig.from_dict([("method", "mtp")])  # type: ignore[arg-type]


# ---- resolve_speculative_config ----------------------------------------------------------
def test_shorthand_defaults():
    # nothing given: the package default (one MTP substep + n-gram, adaptive draft length)
    assert (
        resolve()
        == default_speculative_config()
        == SpeculativeConfig.from_dict(DEFAULT_SPECULATIVE_CONFIG)
    )
    assert resolve().adaptive_draft_length and resolve().mtp_strategy == "with_ngram"
    # any flag: FastDeploy's own defaults for what it leaves out
    assert resolve("--num-speculative-tokens", 3) == SpeculativeConfig("mtp", 3, 3)
    assert resolve("--hybrid-ngram") == SpeculativeConfig("mtp", 3, 1, "with_ngram")
    assert resolve("--num-speculative-tokens", 0).method is None


def test_json_keys_left_out_take_the_flags():
    spec = resolve(
        "--speculative-config", '{"method": "mtp"}', "--num-speculative-tokens", 2, "--hybrid-ngram"
    )
    assert spec == SpeculativeConfig("mtp", 2, 1, "with_ngram")
    assert resolve("--speculative-config", "{}") == SpeculativeConfig("mtp", 3, 3)
    assert resolve("--speculative-config", "{}", "--num-speculative-tokens", 0).method is None


def test_flags_repeating_the_json_are_accepted():
    spec = resolve(
        "--speculative-config",
        '{"num_speculative_tokens": 2, "num_model_steps": 1, "mtp_strategy": "with_ngram"}',
        "--num-speculative-tokens",
        2,
        "--num-model-steps",
        1,
        "--hybrid-ngram",
    )
    assert spec == SpeculativeConfig("mtp", 2, 1, "with_ngram")


@pytest.mark.parametrize(
    "config,flags,names",
    [
        (
            '{"num_speculative_tokens": 2}',
            ["--num-speculative-tokens", 3],
            ["--num-speculative-tokens 3", ": 2"],
        ),
        (
            '{"method": null}',
            ["--num-speculative-tokens", 3],
            ["--num-speculative-tokens 3", '"method": null'],
        ),
        (
            '{"num_speculative_tokens": 3}',
            ["--num-speculative-tokens", 0],
            ["--num-speculative-tokens 0"],
        ),
        (
            '{"num_model_steps": 2}',
            ["--num-model-steps", 1],
            ["--num-model-steps 1", '"num_model_steps": 2'],
        ),
        (
            '{"mtp_strategy": "default"}',
            ["--hybrid-ngram"],
            ["--hybrid-ngram", '"mtp_strategy": "default"'],
        ),
        ('{"method": "none"}', ["--hybrid-ngram"], ["--hybrid-ngram", "no speculation"]),
    ],
)
def test_a_flag_contradicting_the_json_is_an_error(config, flags, names):
    with pytest.raises(UsageError) as info:
        resolve("--speculative-config", config, *flags)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(
    "flags,name",
    [
        (["--num-speculative-tokens", -1], "--num-speculative-tokens"),
        (["--num-model-steps", 0], "--num-model-steps"),
        (["--num-speculative-tokens", 2, "--num-model-steps", 3], "--num-model-steps"),
        (["--num-speculative-tokens", 0, "--hybrid-ngram"], "--hybrid-ngram"),
    ],
)
def test_invalid_speculation_flags(flags, name):
    with pytest.raises(UsageError, match=name):
        resolve(*flags)


# ---- generate / demo ---------------------------------------------------------------------
def generate_json(capsys, *flags, max_tokens=10):
    rc, out, err = run_main(
        capsys, "generate", "--prompt", PROMPT, "--max-tokens", max_tokens, "--json", *flags
    )
    assert rc == 0, err
    return json.loads(out)  # stdout holds the JSON object and nothing else


def test_generate_json(capsys):
    from fastdeploy_mtp.models import ByteTokenizer

    result = generate_json(capsys)
    assert result["prompt"] == PROMPT
    # the engine's ids, the last one included: the token that reaches max_tokens is kept
    # (FastDeploy's ops would emit the end id there)
    ids = result["token_ids"]
    assert len(ids) == 10 and all(0 <= t < 256 for t in ids)
    assert result["text"] == ByteTokenizer().decode(ids)
    metrics = result["metrics"]
    assert 1.0 <= metrics["mean_accepted_length"] <= 4.0
    assert len(metrics["acceptance_per_position"]) == 3
    assert result["speculative_config"]["num_speculative_tokens"] == 3


def test_generate_text_output_has_the_metrics_legend(capsys):
    rc, out, err = run_main(capsys, "generate", "--prompt", PROMPT, "--max-tokens", 6)
    assert rc == 0
    assert out.startswith(PROMPT) and len(out) > len(PROMPT)
    assert "mean accepted len" in err and "cumulative, not conditional" in err and "tokens/s" in err


@pytest.mark.parametrize(
    "flags,config",
    [
        (
            ["--num-speculative-tokens", 3, "--num-model-steps", 1, "--hybrid-ngram"],
            '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1, "mtp_strategy": '
            '"with_ngram"}',
        ),
        (["--num-speculative-tokens", 2], '{"num_speculative_tokens": 2}'),
        (["--num-speculative-tokens", 0], '{"method": null}'),
    ],
)
def test_speculative_config_equals_the_shorthand_flags(capsys, flags, config):
    by_flags = generate_json(capsys, *flags, max_tokens=24)
    by_json = generate_json(capsys, "--speculative-config", config, max_tokens=24)
    assert by_json["token_ids"] == by_flags["token_ids"]
    assert by_json["speculative_config"] == by_flags["speculative_config"]
    # same drafts, so the same number of target forwards
    assert by_json["metrics"]["target_forwards"] == by_flags["metrics"]["target_forwards"]


def test_demo_json(capsys):
    rc, out, err = run_main(
        capsys, "demo", "--max-tokens", 6, "--json", "--num-speculative-tokens", 2
    )
    assert rc == 0, err
    result = json.loads(out)
    assert result["outputs_identical"] is True
    plain, spec = result["rows"]
    assert plain["mode"] == "no speculation" and spec["mode"] == "MTP K=2 S=2"
    assert plain["metrics"]["acceptance_per_position"] == []
    assert len(spec["metrics"]["acceptance_per_position"]) == 2
    assert spec["metrics"]["mean_accepted_length"] > 1.0
    assert spec["metrics"]["target_forwards"] < plain["metrics"]["target_forwards"]
    assert (
        plain["metrics"]["generated_tokens"]
        == spec["metrics"]["generated_tokens"]
        == 6 * result["num_prompts"]
    )
    # by default one prompt at a time, where speculation pays most on a CPU, and a note saying so
    assert result["max_num_seqs"] == demo.DEMO_MAX_NUM_SEQS == 1
    assert result["note"] == demo.batch_note(1)
    assert "batch 1" in result["note"] and "--max-num-seqs 8" in result["note"]


def test_demo_prints_a_note_on_the_batch_size_under_the_table(capsys):
    rc, out, err = run_main(capsys, "demo", "--max-tokens", 3, "--max-num-seqs", 8)
    assert rc == 0, err
    assert "batch 8" in err  # the progress header
    lines = out.splitlines()
    note = next(i for i, ln in enumerate(lines) if ln.startswith("note:"))
    assert lines[note] == demo.batch_note(8)
    assert lines[note - 1].startswith("MTP K=3")  # right under the table's last row
    assert "batch 8" in lines[note] and "--max-num-seqs 1 is the default" in lines[note]
    assert "identical: yes" in out


def test_demo_plot_writes_a_png(capsys, tmp_path):
    path = tmp_path / "acceptance.png"
    rc, out, err = run_main(capsys, "demo", "--max-tokens", 4, "--plot", path)
    assert rc == 0, err
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 5000  # a rendered chart, not an empty canvas
    assert "identical: yes" in out


#: the drafting methods a method mix can name
DRAFT_METHODS = {"mtp", "ngram", "suffix", "forced"}


def test_demo_batch_sizes_table(capsys):
    rc, out, err = run_main(capsys, "demo", "--batch-sizes", "1,2", "--max-tokens", 8)
    assert rc == 0, err
    assert "batch 1: 1 requests" in err and "batch 2: 2 requests" in err  # progress per size
    assert "exactly 8 tokens (ignore_eos" in out
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("batch "))
    header = lines[head].split("  ")
    assert [c.strip() for c in header if c.strip()] == [
        "batch",
        *demo_sweep.SWEEP_COLUMNS,
        "outputs identical",
    ]
    rows = [ln.split() for ln in lines[head + 2 : head + 4]]
    assert [r[0] for r in rows] == ["1", "2"]
    for r in rows:
        assert r[3].endswith("x") and r[-1] == "yes"  # the ratio; outputs identical
        mix = dict(zip(r[6:-1:2], (int(p.rstrip("%")) for p in r[7:-1:2])))
        assert set(mix) <= DRAFT_METHODS and abs(sum(mix.values()) - 100) <= len(mix)
    assert "outputs with and without speculation identical: yes" in out


def test_demo_batch_sizes_json(capsys):
    rc, out, err = run_main(
        capsys, "demo", "--batch-sizes", "2,1", "--max-tokens", 8, "--json", "--hybrid-ngram"
    )
    assert rc == 0, err
    result = json.loads(out)
    assert result["ignore_eos"] is True and result["outputs_identical"] is True
    assert [r["batch_size"] for r in result["rows"]] == [2, 1]
    for row in result["rows"]:
        # every request ran to --max-tokens on both sides: equal work
        tokens = 8 * row["batch_size"]
        assert row["generated_tokens_plain"] == row["generated_tokens_spec"] == tokens
        assert row["ratio"] == pytest.approx(
            row["tokens_per_second_spec"] / row["tokens_per_second_plain"], rel=1e-2
        )
        assert 0.0 < row["drafts_per_slot_round"] <= 3.0
        assert 1.0 <= row["mean_accepted_length"] <= 4.0
        drafts = row["method_drafts"]
        assert set(drafts) <= DRAFT_METHODS and sum(n for n, _ in drafts.values()) > 0
        assert all(0 <= accepted <= offered for offered, accepted in drafts.values())


@pytest.mark.parametrize(
    "flags,name",
    [
        (["--batch-sizes", "1,0"], "argument --batch-sizes: must be > 0"),
        (["--batch-sizes", "1,x"], "argument --batch-sizes"),
        (["--batch-sizes", "1", "--max-num-seqs", 4], "--max-num-seqs"),
        (["--batch-sizes", "1", "--plot", "a.png"], "--plot"),
    ],
)
def test_demo_batch_sizes_errors(capsys, monkeypatch, flags, name):
    monkeypatch.setattr(demo_sweep, "run_prompts", never_run)
    rc, _, err = run_main(capsys, "demo", *flags)
    assert rc == 2 and name in error_line(err)


def never_run(*args, **kwargs):
    raise AssertionError("the command should have failed before generating")


def test_demo_plot_errors_before_the_run(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "run_prompts", never_run)
    rc, _, err = run_main(capsys, "demo", "--plot", tmp_path / "missing" / "a.png")
    assert rc == 2 and "--plot" in error_line(err)
    rc, _, err = run_main(capsys, "demo", "--plot", tmp_path)
    assert rc == 2 and "directory" in error_line(err)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # import fails
    rc, _, err = run_main(capsys, "demo", "--plot", tmp_path / "a.png")
    assert rc == 1 and "matplotlib" in error_line(err)


# ---- sampling ----------------------------------------------------------------------------
SAMPLE = ("--temperature", 0.8, "--top-p", 0.9, "--seed", 7)
MTP3 = '{"method":"mtp","num_speculative_tokens":3}'


@pytest.mark.parametrize("strategy", ["rejection", "topp"])
@pytest.mark.parametrize("max_tokens", [1, 2, 6])
def test_rejection_and_topp_emit_real_tokens_up_to_max_tokens(capsys, strategy, max_tokens):
    """Every id is a real token (< the byte vocabulary's 256; the padded ids 256..271 hold
    the end-id stand-in), the one reaching max_tokens included; greedy requests equal greedy
    decoding without speculation under every strategy."""
    config = json.dumps({"method": "mtp", "num_speculative_tokens": 1, "verify_strategy": strategy})
    plain = generate_json(capsys, "--num-speculative-tokens", 0, max_tokens=max_tokens)
    greedy = generate_json(capsys, "--speculative-config", config, max_tokens=max_tokens)
    assert greedy["token_ids"] == plain["token_ids"] and greedy["text"] == plain["text"]
    sampled = generate_json(capsys, *SAMPLE, "--speculative-config", config, max_tokens=max_tokens)
    for result in (greedy, sampled):
        ids = result["token_ids"]
        assert len(ids) == max_tokens and all(0 <= t < 256 for t in ids), ids
        assert result["finish_reason"] == "length"


def test_seeded_sampling_gives_the_same_tokens_with_and_without_speculation(capsys):
    # the acceptance: the same command with and without --speculative-config
    default = generate_json(capsys, *SAMPLE, max_tokens=24)
    mtp = generate_json(capsys, *SAMPLE, "--speculative-config", MTP3, max_tokens=24)
    plain = generate_json(capsys, *SAMPLE, "--num-speculative-tokens", 0, max_tokens=24)
    assert default["token_ids"] == mtp["token_ids"] == plain["token_ids"]
    assert default["text"] == mtp["text"] == plain["text"]
    assert default["finish_reason"] == mtp["finish_reason"] == plain["finish_reason"]
    assert mtp["sampling"] == {
        **SamplingParams().to_dict(),
        "temperature": 0.8,
        "top_p": 0.9,
        "seed": 7,
    }
    assert "logprobs" not in mtp
    greedy = generate_json(capsys, "--speculative-config", MTP3, max_tokens=24)
    other_seed = generate_json(capsys, *SAMPLE[:-1], 8, "--speculative-config", MTP3, max_tokens=24)
    assert greedy["token_ids"] != mtp["token_ids"], (
        "temperature 0.8 should change the tiny model's output"
    )
    assert other_seed["token_ids"] != mtp["token_ids"]


def test_generate_logprobs_and_stop(capsys):
    full = generate_json(capsys, *SAMPLE, "--logprobs", 2, max_tokens=16)
    assert len(full["logprobs"]) == len(full["token_ids"])
    # the sampled answer runs to max_tokens or ends with the model's <|endoftext|> (id 256)
    ends = full["finish_reason"] == "stop" and full["token_ids"][-1] == 256
    assert len(full["token_ids"]) == 16 or ends, full
    for entry, tid in zip(full["logprobs"], full["token_ids"]):
        assert entry["token_id"] == tid and entry["logprob"] <= 0.0
        assert len(entry["top"]) == 2 and entry["top"][0]["logprob"] >= entry["top"][1]["logprob"]
        assert entry["logprob"] <= entry["top"][0]["logprob"] + 1e-5
    stop = full["text"][6:8]
    cut = generate_json(capsys, *SAMPLE, "--stop", "\x00never", "--stop", stop, max_tokens=16)
    assert cut["text"] == full["text"][: full["text"].index(stop)]
    assert cut["finish_reason"] == "stop"
    rc, out, err = run_main(
        capsys, "generate", "--prompt", PROMPT, "--max-tokens", 4, "--logprobs", 1, *SAMPLE
    )
    assert rc == 0 and out.startswith(PROMPT) and len(out.splitlines()) >= 4, err


@pytest.mark.parametrize(
    "flags,name",
    [
        (["--temperature", -1], "--temperature"),
        (["--temperature", "hot"], "--temperature"),
        (["--top-p", 1.5], "--top-p"),
        (["--top-k", -2], "--top-k"),
        (["--min-p", 3], "--min-p"),
        (["--seed", -1], "--seed"),
        (["--repetition-penalty", 0], "--repetition-penalty"),
        (["--frequency-penalty", 9], "--frequency-penalty"),
        (["--presence-penalty", -9], "--presence-penalty"),
        (["--stop", ""], "--stop"),
        (["--logprobs", 21], "--logprobs"),
        (
            ["--temperature", 0.5, "--speculative-config", '{"verify_strategy": "greedy"}'],
            "verify_strategy",
        ),
    ],
)
def test_bad_sampling_flags_exit_2_with_one_line(capsys, monkeypatch, flags, name):
    monkeypatch.setattr(generate, "run_requests", never_run)
    rc, out, err = run_main(capsys, "generate", "--prompt", "x", *flags)
    assert rc == 2 and out == ""
    assert name in error_line(err)


def test_demo_takes_temperature_and_seed(capsys):
    rc, out, err = run_main(
        capsys, "demo", "--max-tokens", 6, "--json", "--temperature", 0.8, "--seed", 7
    )
    assert rc == 0, err
    result = json.loads(out)
    assert result["outputs_identical"] is True
    assert result["sampling"]["temperature"] == 0.8 and result["sampling"]["seed"] == 7


# ---- the error contract ------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv,status,name",
    [
        (["generate"], 2, "--prompt"),
        (["generate", "--prompt", "x", "--max-tokens", 0], 2, "--max-tokens"),
        (["generate", "--prompt", "x", "--max-tokens", "many"], 2, "--max-tokens"),
        (["generate", "--prompt", ""], 2, "--prompt"),
        (["demo", "--num-speculative-tokens", 0], 2, "speculation"),
        (["generate", "--prompt", "x", "--speculative-config", '{"k": 3}'], 2, "'k'"),
        (
            ["generate", "--prompt", "x", "--speculative-config", "{}", "--num-model-steps", 5],
            2,
            "num_model_steps",
        ),
        (["frobnicate"], 2, "frobnicate"),
        # the request would not fit the model: said in the command's terms, no request id
        (["generate", "--prompt", "x", "--max-tokens", 100000], 2, "--max-tokens: 100000"),
        (["demo", "--max-tokens", 5000], 2, "--max-tokens: 5000"),
        (["generate", "--prompt", "x" * 5000, "--max-tokens", 1], 2, "--prompt: 5000 tokens"),
        (["check-drafts", "--model", "/nonexistent/folder"], 2, "--model"),
        (
            ["check-drafts", "--model", "/nonexistent/folder", "--num-speculative-tokens", 9],
            2,
            "--num-speculative-tokens must be <= 8, got 9",
        ),
        *[
            ([*command, "--port", port], 2, "argument --port: must be a TCP port, 1..65535")
            for command in (["serve"], ["router", "--prefill", "http://a", "--decode", "http://b"])
            for port in ("70000", "112696")
        ],
        (["router", "--prefill", "http://a:70000", "--decode", "http://b"], 2, "--prefill"),
        (["router", "--prefill", "http://a", "--decode", "http://b:0"], 2, "--decode"),
        (["serve", "--log-level", "loud"], 2, "--log-level"),
        (
            ["generate", "--prompt", "x", "--checkpoint", "/nonexistent/ckpt"],
            2,
            "/nonexistent/ckpt",
        ),
    ],
)
def test_errors_are_one_line_with_the_exit_status(capsys, argv, status, name):
    rc, out, err = run_main(capsys, *argv)
    assert rc == status
    assert out == ""
    assert name in error_line(err)
    assert "'p0'" not in err  # no internal request id


def test_ctrl_c_exits_130_quietly(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "run_requests", interrupted)
    before = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    rc, out, err = run_main(capsys, "generate", "--prompt", "x")
    assert (rc, out, err.split()) == (130, "", ["fastdeploy-mtp:", "interrupted"])
    # called in-process, main leaves the caller's Ctrl-C as it was: an ignored SIGINT here
    # would be inherited by every process the caller starts later
    assert (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])) == before


def test_process_exit_status_and_no_traceback(tmp_path):
    """As a process: a bad --speculative-config is one stderr line and exit status 2;
    FDMTP_DEBUG=1 shows the traceback instead."""
    argv = [
        sys.executable,
        "-m",
        "fastdeploy_mtp.entrypoints.cli",
        "generate",
        "--prompt",
        "x",
        "--speculative-config",
        "{bad",
    ]
    env = {k: v for k, v in os.environ.items() if k != "FDMTP_DEBUG"}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "fastdeploy-mtp: error: speculative config is not valid JSON: Expecting property name "
        "enclosed in double quotes: line 1 column 2 (char 1)"
    ]
    debug = subprocess.run(
        argv, cwd=REPO, env={**env, "FDMTP_DEBUG": "1"}, capture_output=True, text=True, timeout=120
    )
    assert debug.returncode != 0
    assert "Traceback" in debug.stderr and "SpeculativeConfigError" in debug.stderr


#: Runs ``main(argv)`` in a fresh interpreter and writes its exit status and the heavy
#: frameworks it imported (as JSON) to the file named by the first argument.
_IMPORTS_PROBE = """
import json, sys
from fastdeploy_mtp.entrypoints.cli import main
status = main(sys.argv[2:])
heavy = [m for m in ("paddle", "torch", "transformers") if m in sys.modules]
with open(sys.argv[1], "w") as f:
    json.dump({"status": status, "heavy": heavy}, f)
"""


@pytest.mark.parametrize(
    "argv, status",
    [
        (["--help"], 0),
        (["--version"], 0),
        *[([command, "--help"], 0) for command in ("demo", "generate", "serve", "router")],
        (["check-drafts", "--help"], 0),
        (["generate", "--prompt", "x", "--no-such-flag"], 2),
        (["serve", "--port", "abc"], 2),
        (["generate", "--prompt", "x", "--speculative-config", "{bad"], 2),
        (["generate", "--prompt", "x", "--temperature", "-1"], 2),
        (["demo", "--model", "/no/such/folder"], 2),
    ],
)
def test_help_and_argument_errors_do_not_import_the_frameworks(tmp_path, argv, status):
    """``--help`` and a bad argument (the shipped folder's check included) answer without
    importing Paddle, torch or transformers: the commands import them only to run."""
    out = tmp_path / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTS_PROBE, str(out), *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == {"status": status, "heavy": []}


# ---- options every command shares (fastdeploy_mtp.engine_args) ---------------------------
SHIPPED = default_model()


def test_generate_and_demo_take_model(capsys):
    by_default = generate_json(capsys, max_tokens=4)
    by_model = generate_json(capsys, "--model", SHIPPED, max_tokens=4)
    assert by_model["token_ids"] == by_default["token_ids"]
    rc, out, err = run_main(capsys, "demo", "--model", SHIPPED, "--max-tokens", 2, "--json")
    assert rc == 0, err
    result = json.loads(out)
    assert result["checkpoint"] == SHIPPED and result["outputs_identical"] is True
    assert "deprecated" not in err


def test_serve_takes_model(capsys, monkeypatch):
    """``serve --model DIR`` hands DIR to the server (which is not started here)."""
    from fastdeploy_mtp.serving.processes import launcher

    seen = []
    monkeypatch.setattr(launcher, "serve", lambda opts: seen.append(opts) or 0)
    rc, _, err = run_main(capsys, "serve", "--model", SHIPPED)
    assert rc == 0, err
    assert [opts.model for opts in seen] == [SHIPPED]


@pytest.mark.parametrize(
    "command", [["generate", "--prompt", "x"], ["demo"], ["serve", "--port", "1"]]
)
def test_a_directory_that_is_no_checkpoint_is_refused_alike(capsys, monkeypatch, tmp_path, command):
    monkeypatch.setattr(generate, "run_requests", never_run)
    monkeypatch.setattr(demo, "run_prompts", never_run)
    rc, out, err = run_main(capsys, *command, "--model", tmp_path)
    assert rc == 2 and out == ""  # a bad argument, refused before anything loads
    assert error_line(err) == f"fastdeploy-mtp: error: model folder {tmp_path}: no config.json"


@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["demo"]])
def test_checkpoint_is_a_deprecated_spelling_of_model(capsys, monkeypatch, command):
    seen = []

    def record(*args, **kwargs):
        seen.append(args[5])  # the model folder
        raise KeyboardInterrupt  # stop before any model is loaded

    monkeypatch.setattr(generate, "run_requests", record)
    monkeypatch.setattr(demo, "run_prompts", record)
    rc, out, err = run_main(capsys, *command, "--checkpoint", SHIPPED)
    assert (rc, out, seen) == (130, "", [SHIPPED])
    warnings = [ln for ln in err.splitlines() if "deprecated" in ln]
    assert warnings == ["fastdeploy-mtp: warning: --checkpoint is deprecated; use --model"]


@pytest.mark.parametrize(
    "speculation",
    [
        ["--num-speculative-tokens", 9],
        ["--speculative-config", '{"num_speculative_tokens": 9, "num_model_steps": 1}'],
    ],
)
def test_every_command_refuses_more_than_eight_drafts_alike(capsys, monkeypatch, speculation):
    """K = 9 is above ``MAX_NUM_SPECULATIVE_TOKENS`` (8): ``generate``, ``demo`` and ``serve``
    (on either token channel) refuse it with the same line, before running anything
    (``serve`` before starting any process)."""
    monkeypatch.setattr(generate, "run_requests", never_run)
    monkeypatch.setattr(demo, "run_prompts", never_run)
    lines = set()
    for command in (
        ["generate", "--prompt", "x"],
        ["demo"],
        ["serve", "--port", "1"],
        ["serve", "--port", "1", "--token-channel", "sysv"],
    ):
        rc, out, err = run_main(capsys, *command, *speculation)
        assert rc == 2 and out == "", command  # a bad argument
        lines.add(error_line(err))
    assert lines == {
        "fastdeploy-mtp: error: speculative config: SpeculativeConfig.num_speculative_tokens "
        "must be <= 8, got 9"
    }


@pytest.mark.parametrize("command", [["demo"], ["serve", "--port", "1"]])
@pytest.mark.parametrize("value", [0, -1, "x"])
def test_max_num_seqs_is_refused_alike(capsys, monkeypatch, command, value):
    monkeypatch.setattr(demo, "run_prompts", never_run)
    rc, out, err = run_main(capsys, *command, "--max-num-seqs", value)
    assert rc == 2 and out == ""
    assert "argument --max-num-seqs: must be " in error_line(err)
