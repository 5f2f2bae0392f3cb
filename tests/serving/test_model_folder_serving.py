"""A HuggingFace model folder served end to end: a tiny random Qwen3-style folder with two
MTP layers (DeepSeek-style names), a byte-level BPE tokenizer and a ChatML chat template.

``generate --json`` on it (and on the shipped model) prints the output ids and the speculation
metrics; ``serve DIR`` with MTP (K=3, so both MTP layers draft) at tensor-parallel size 1 and
2, and a prefill + decode pair behind ``fastdeploy-mtp router --tokenizer DIR``, give the
``openai`` client exactly ``generate``'s output, greedy and seeded-sampled; a chat renders the
folder's template and its usage counts are the tokenizer's; the EOS ids of
``generation_config.json`` end a request unless ``ignore_eos``; the hand-over from prefill to
decode carries every cache of both MTP layers. A folder that cannot be served is refused by
the CLI, in one line with exit status 2, before anything loads or any process starts."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.folder_serving import Generate, folder_fixtures, generate_fixture, run_cli
from tests.support.handover import handed_over_every_cache, router_command
from tests.support.hf_folders import MTP_SHARD, make_folder
from tests.support.servers import ServerProcess, serving, splitwise_instances
from tests.support.tokenizer_files import write_bpe_tokenizer

openai = pytest.importorskip("openai")

MTP = '{"method": "mtp", "num_speculative_tokens": 3}'
MAX_TOKENS = 24
TARGET_LAYERS, MTP_LAYERS = 2, 2
#: greedy on the folder: the first runs to MAX_TOKENS, the second ends at EOS id 2 (config.json's
#: and the tokenizer's), the third at EOS id 0 (only generation_config.json names it)
PROMPTS = ["Speculative decoding drafts", "The quick brown fox", "Hello"]
#: explicit sampling fields, not generation_config.json's (temperature 0.7, top_p 0.9, top_k 20)
SAMPLED = {"temperature": 0.8, "seed": 7, "top_p": 0.95, "top_k": 50}
SAMPLED_FLAGS = ["--temperature", "0.8", "--seed", "7", "--top-p", "0.95", "--top-k", "50"]
CHAT = [{"role": "user", "content": "The quick brown fox"}]


folder, tokenizer = folder_fixtures(
    "qwen3-mtp2",
    lambda out: make_folder(
        out, "qwen3", num_mtp_layers=MTP_LAYERS, tokenizer_writer=write_bpe_tokenizer
    ),
)


#: ``generate(prompt, *flags, model=folder)``: ``fastdeploy-mtp generate --json`` with MTP
#: (``MAX_TOKENS``), parsed; each distinct call runs once
generate = generate_fixture(MTP, MAX_TOKENS)


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


# ---- generate -------------------------------------------------------------------------------
@pytest.mark.parametrize("shipped", [False, True], ids=["folder", "shipped"])
def test_generate_json_prints_the_output_ids_and_the_speculation_metrics(
    generate: Generate, tokenizer: Any, shipped: bool
) -> None:
    out = generate(PROMPTS[0], "--temperature", "0", **({"model": None} if shipped else {}))
    ids, metrics = out["token_ids"], out["metrics"]
    assert 0 < len(ids) <= MAX_TOKENS and all(isinstance(t, int) for t in ids)
    assert metrics["generated_tokens"] == len(ids) and metrics["target_forwards"] <= len(ids)
    # one request: its first token comes from the prefill forward, the rest from decode rounds
    rounds = metrics["target_forwards"] - 1
    assert metrics["mean_accepted_length"] == pytest.approx((len(ids) - 1) / rounds, abs=1e-3)
    acceptance = metrics["acceptance_per_position"]
    assert len(acceptance) == 3 and all(
        a is not None for a in acceptance
    )  # every draft position offered
    if shipped:  # the shipped MTP layer was trained: its drafts are accepted
        assert metrics["mean_accepted_length"] > 1.0
    else:
        assert out["text"] == tokenizer.decode(ids)


# ---- serve DIR, TP 1 and 2 -----------------------------------------------------------------
@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def server(request: pytest.FixtureRequest, folder: str) -> Iterator[ServerProcess]:
    yield from serving(
        [folder, "--speculative-config", MTP, "--tensor-parallel-size", str(request.param)]
    )


def test_serve_publishes_the_caches_of_both_mtp_layers_on_every_rank(
    server: ServerProcess, request: pytest.FixtureRequest
) -> None:
    tp = request.node.callspec.params["server"]
    log = server.output()
    assert len(server.worker_pids()) == tp and f"MTP K=3 S=3, tp {tp}," in log, log
    for rank in range(tp):
        assert f"rank {rank}: 8 KV caches published (4 target + 4 MTP, float32," in log, log


def check_completions(url: str, folder: str, tokenizer: Any, generate: Generate) -> None:
    """Greedy completions of every prompt and one seeded sampled one through ``url`` equal
    ``generate``'s (text, finish reason, token counts); the model id is the folder."""
    c = client(url)
    assert [m.id for m in c.models.list().data] == [folder]
    for prompt in PROMPTS:
        want = generate(prompt, "--temperature", "0")
        got = c.completions.create(
            model=folder, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert got.model == folder
        choice = got.choices[0]
        assert (choice.text, choice.finish_reason) == (want["text"], want["finish_reason"]), prompt
        assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
            len(tokenizer.encode(prompt)),
            len(want["token_ids"]),
        ), prompt
    want = generate(PROMPTS[0], *SAMPLED_FLAGS)
    sampled = {k: v for k, v in SAMPLED.items() if k != "top_k"}
    got = c.completions.create(
        model=folder,
        prompt=PROMPTS[0],
        max_tokens=MAX_TOKENS,
        extra_body={"top_k": SAMPLED["top_k"]},
        **sampled,
    )
    assert got.choices[0].text == want["text"] and got.usage.completion_tokens == len(
        want["token_ids"]
    )
    assert want["text"] != generate(PROMPTS[0], "--temperature", "0")["text"]  # it did sample


def check_chat(url: str, folder: str, tokenizer: Any, generate: Generate) -> None:
    """A chat through ``url``: the prompt is the folder's ChatML template over the messages
    (its special tokens read as special ids), the answer ``generate``'s on that prompt."""
    rendered = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nThe quick brown fox<|im_end|>\n<|im_start|>assistant\n"
    )
    prompt_ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert prompt_ids.count(1) == 3 and prompt_ids.count(2) == 2  # <|im_start|>, <|im_end|>
    want = generate(rendered, "--temperature", "0")
    got = client(url).chat.completions.create(
        model=folder, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0
    )
    assert got.model == folder
    assert (got.choices[0].message.content, got.choices[0].finish_reason) == (
        want["text"],
        want["finish_reason"],
    )
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
        len(prompt_ids),
        len(want["token_ids"]),
    )


def test_serve_completions_equal_generate_greedy_and_seeded(
    server: ServerProcess, folder: str, tokenizer: Any, generate: Generate
) -> None:
    check_completions(server.base_url, folder, tokenizer, generate)


def test_serve_chat_renders_the_folders_template(
    server: ServerProcess, folder: str, tokenizer: Any, generate: Generate
) -> None:
    check_chat(server.base_url, folder, tokenizer, generate)


def test_generation_config_eos_ends_a_request_unless_ignore_eos(
    server: ServerProcess, folder: str, generate: Generate
) -> None:
    want = generate(PROMPTS[2], "--temperature", "0")
    assert want["token_ids"][-1] == 0 and want["finish_reason"] == "stop"  # <|endoftext|>
    c = client(server.base_url)
    ended = c.completions.create(
        model=folder, prompt=PROMPTS[2], max_tokens=MAX_TOKENS, temperature=0
    )
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens == len(
        want["token_ids"]
    )
    past = c.completions.create(
        model=folder,
        prompt=PROMPTS[2],
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert past.choices[0].finish_reason == "length" and past.usage.completion_tokens == MAX_TOKENS
    assert past.choices[0].text.startswith(ended.choices[0].text)


# ---- prefill + decode behind the router ----------------------------------------------------
@pytest.fixture(scope="module")
def pd(folder: str) -> Iterator[list[ServerProcess]]:
    with splitwise_instances(
        ("prefill", MTP, "--model", folder), ("decode", MTP, "--model", folder)
    ) as both:
        yield both


def test_router_over_prefill_and_decode_equals_generate(
    pd: list[ServerProcess], folder: str, tokenizer: Any, generate: Generate
) -> None:
    prefill, decode = pd
    with router_command(prefill.base_url, decode.base_url, "--tokenizer", folder) as url:
        check_completions(url, folder, tokenizer, generate)
        check_chat(url, folder, tokenizer, generate)


def test_hand_over_carries_every_cache_of_both_mtp_layers(
    pd: list[ServerProcess], tokenizer: Any, generate: Generate
) -> None:
    prefill, decode = pd
    ids = handed_over_every_cache(
        prefill.base_url,
        decode.base_url,
        "e2e-hand-over",
        tokenizer.encode(PROMPTS[0]),
        target_layers=TARGET_LAYERS,
        mtp_layers=MTP_LAYERS,
        tensor_parallel_size=1,
        max_tokens=MAX_TOKENS,
    )
    assert (
        ids == generate(PROMPTS[0], "--temperature", "0")["token_ids"]
    )  # it runs to MAX_TOKENS, no EOS


# ---- refusals, before anything loads -------------------------------------------------------
def broken_copy(folder: str, out: Path, kind: str) -> str:
    """A copy of ``folder`` with one fault: ``arch`` an unsupported architecture, ``shard`` a
    missing weight shard, ``no-mtp`` no MTP layer (its shard and index entries dropped)."""
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    if kind == "arch":
        config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    elif kind == "shard":
        os.remove(out / "model-00002-of-00006.safetensors")
    else:
        os.remove(out / MTP_SHARD)
        config.pop("num_nextn_predict_layers")
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != MTP_SHARD}
    (out / "config.json").write_text(json.dumps(config))
    index_path.write_text(json.dumps(index))
    return str(out)


def _half_precision_runs() -> bool:
    from fastdeploy_mtp.models.folder_inspection import half_precision_runs

    return half_precision_runs()


REFUSALS = [
    pytest.param(
        "arch", [], "config.json `architectures` 'GPT2LMHeadModel' is not supported", id="arch"
    ),
    pytest.param(
        "shard",
        [],
        "shard model-00002-of-00006.safetensors named in model.safetensors.index.json is missing",
        id="shard",
    ),
    pytest.param(
        "no-mtp",
        ["--speculative-config", MTP],
        "has no MTP layer (config.json `num_nextn_predict_layers` is 0",
        id="mtp",
    ),
    pytest.param(
        "good",
        ["--dtype", "bfloat16"],
        "dtype 'bfloat16' needs a GPU",
        marks=pytest.mark.skipif(_half_precision_runs(), reason="this device runs bfloat16"),
        id="bfloat16",
    ),
]


@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("kind, flags, message", REFUSALS)
def test_cli_refuses_a_folder_it_cannot_run_in_one_line(
    folder: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    kind: str,
    flags: list[str],
    message: str,
) -> None:
    def started(*_: Any, **__: Any) -> None:
        raise AssertionError(f"{command} got past the folder check")

    monkeypatch.setattr("fastdeploy_mtp.serving.processes.launcher.serve", started)
    monkeypatch.setattr("fastdeploy_mtp.entrypoints.generate.run_requests", started)
    path = folder if kind == "good" else broken_copy(folder, tmp_path / kind, kind)
    where = ["--prompt", "hi", "--model", path] if command == "generate" else [path]
    code, out, err = run_cli([command, *where, *flags])
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    assert err.startswith("fastdeploy-mtp: error: ") and message in err, err


def test_serve_refuses_a_positional_folder_and_a_different_model(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "fastdeploy_mtp.serving.processes.launcher.serve", lambda *_: pytest.fail("serve started")
    )
    code, out, err = run_cli(["serve", folder, "--model", str(tmp_path)])
    assert code == 2 and err.count("\n") == 1, (code, out, err)
    assert f"the model folder is given twice: {folder!r} and --model {str(tmp_path)!r}" in err
