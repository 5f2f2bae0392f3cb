"""The OpenAI app over a tokenizer, with a scripted backend (no engine): chat prompts come from
the chat template and are tokenized without special tokens, completions with them; texts,
logprob token strings / bytes and text offsets come from the tokenizer; ``usage`` counts
tokens; the model's EOS ids end a response unless ``ignore_eos``; ``generation_config.json``
fills the fields a request leaves out. And a stop string that spans a BPE token boundary is
found in the detokenized text."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from fastdeploy_mtp.models import ASSETS_DIR
from fastdeploy_mtp.runtime.request import Request
from fastdeploy_mtp.runtime.sampling_params import SamplingParams, TokenLogprob
from fastdeploy_mtp.runtime.stops import cut_at_stop_ids, cut_at_stop_string, safe_to_emit
from fastdeploy_mtp.serving.engine_client.backend import Stream
from fastdeploy_mtp.serving.openai.app import create_app
from fastdeploy_mtp.serving.openai.text import emitted_of
from fastdeploy_mtp.tokenization import load_generation_config, load_tokenizer
from tests.support.tokenizer_files import write_bpe_tokenizer

REPLY = "Bonjour, café 日本語 🎉!"
EOS = 2  # <|im_end|> in the fixture


class ScriptedBackend:
    """Emits ``reply`` one token per event, cut after a stop token id as the engine cuts."""

    fatal = None

    def __init__(self, reply: list[int]):
        self.reply = reply
        self.registry = CollectorRegistry()
        self.requests: list[Request] = []

    def validate(self, req: Request) -> None:
        pass

    def submit(self, req: Request) -> Stream:
        self.requests.append(req)
        stream = Stream(req, asyncio.get_running_loop())
        ids, stopped = cut_at_stop_ids(req, self.reply[: req.max_tokens])
        for t in ids:
            req.output_token_ids.append(t)
            if req.sampling.logprobs is not None:
                req.output_logprobs.append(TokenLogprob(t, -0.25, [(t, -0.25), (EOS, -3.0)]))
            req.emitted_count += 1
            stream.put("tokens", emitted_of(req, [t]))
        stream.put("finished", "stop" if stopped else "length")
        return stream

    def cancel(self, req: Request) -> None:
        pass

    async def health(self) -> str | None:
        return None


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_bpe_tokenizer(str(tmp_path_factory.mktemp("served")))


def make_client(folder, reply):
    tok = load_tokenizer(folder)
    backend = ScriptedBackend(reply)
    app = create_app(backend, "m", tok, load_generation_config(folder))
    return TestClient(app), backend, tok


def reply_ids(tok):
    return [*tok.encode(REPLY), EOS, *tok.encode(" after eos")]


def test_chat_uses_the_template_and_stops_at_eos(folder):
    tok = load_tokenizer(folder)
    client, backend, _ = make_client(folder, reply_ids(tok))
    messages = [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Salut"}]
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 60})
    assert r.status_code == 200, r.text
    body = r.json()
    req = backend.requests[0]
    assert req.prompt_token_ids == tok.encode(
        tok.apply_chat_template(messages), add_special_tokens=False
    )
    assert EOS in req.sampling.stop_token_ids
    assert body["choices"][0]["message"]["content"] == REPLY
    assert body["choices"][0]["finish_reason"] == "stop"
    n_reply = len(tok.encode(REPLY)) + 1  # the EOS id is returned (as the engine keeps it)
    assert body["usage"] == {
        "prompt_tokens": len(req.prompt_token_ids),
        "completion_tokens": n_reply,
        "total_tokens": len(req.prompt_token_ids) + n_reply,
    }


def test_ignore_eos_generates_past_eos(folder):
    tok = load_tokenizer(folder)
    client, backend, _ = make_client(folder, reply_ids(tok))
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 60, "ignore_eos": True})
    assert EOS not in backend.requests[0].sampling.stop_token_ids
    assert (
        r.json()["choices"][0]["text"] == REPLY + " after eos"
    )  # EOS, a special token, has no text
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_streamed_logprobs_are_token_strings_bytes_and_char_offsets(folder):
    tok = load_tokenizer(folder)
    client, _, _ = make_client(folder, reply_ids(tok))
    body = {"prompt": "x", "max_tokens": 60, "stream": True, "logprobs": 1}
    with client.stream("POST", "/v1/completions", json=body) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["text"] for e in events)
    assert text == REPLY
    assert all("\ufffd" not in e["choices"][0]["text"] for e in events)  # no split character
    lps = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    tokens = [t for lp in lps for t in lp["tokens"]]
    offsets = [o for lp in lps for o in lp["text_offset"]]
    ids = reply_ids(tok)[: len(tokens)]
    assert tokens == [tok.token_string(t) for t in ids] and tokens[-1] == "<|im_end|>"
    assert "\ufffd" in tokens  # a token holding part of a character
    assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] == len(REPLY)
    assert lps[0]["top_logprobs"][0] == {tokens[0]: -0.25, "<|im_end|>": -3.0}


def test_chat_logprob_bytes_rebuild_the_text(folder):
    tok = load_tokenizer(folder)
    client, _, _ = make_client(folder, reply_ids(tok))
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "logprobs": True},
    )
    content = r.json()["choices"][0]["logprobs"]["content"]
    raw = b"".join(bytes(c["bytes"]) for c in content[:-1])  # all but the EOS token
    assert raw.decode("utf-8") == REPLY
    assert content[-1]["token"] == "<|im_end|>" and content[-1]["bytes"] == list(b"<|im_end|>")


def test_completions_add_special_tokens(tmp_path):
    folder = write_bpe_tokenizer(str(tmp_path), bos_token="<|endoftext|>", prepend_bos=True)
    tok = load_tokenizer(folder)
    client, backend, _ = make_client(folder, tok.encode("ok", add_special_tokens=False))
    client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
    assert backend.requests[0].prompt_token_ids == [
        0,
        *tok.encode("hello", add_special_tokens=False),
    ]
    client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]})
    assert backend.requests[1].prompt_token_ids.count(0) == 1  # the template's BOS only


def test_generation_config_fills_what_the_request_leaves_out(tmp_path):
    folder = write_bpe_tokenizer(str(tmp_path))
    gen = {
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 20,
        "max_new_tokens": 3,
        "eos_token_id": [1, EOS],
    }
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    tok = load_tokenizer(folder)
    client, backend, _ = make_client(folder, reply_ids(tok))
    client.post("/v1/completions", json={"prompt": "x"})
    client.post(
        "/v1/completions", json={"prompt": "x", "temperature": 0.0, "top_k": -1, "max_tokens": 7}
    )
    first, second = (r.sampling for r in backend.requests)
    assert (first.temperature, first.top_p, first.top_k, backend.requests[0].max_tokens) == (
        0.6,
        0.9,
        20,
        3,
    )
    assert (second.temperature, second.top_p, second.top_k, backend.requests[1].max_tokens) == (
        0.0,
        0.9,
        0,
        7,
    )
    assert first.stop_token_ids == [EOS, 1]  # the tokenizer's EOS, then generation_config's


def test_a_refused_chat_is_a_400_naming_messages(folder):
    client, _, _ = make_client(folder, [5])
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "tool", "content": "x"}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"
    assert "Unexpected role: tool" in r.json()["error"]["message"]


def test_byte_model_chat_prompt_is_role_lines():
    client, backend, _ = make_client(ASSETS_DIR, [104, 105])
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert backend.requests[0].prompt_token_ids == list(b"user: hi\nassistant:")
    # the byte model's EOS, <|endoftext|>, ends the answer
    assert backend.requests[0].sampling.stop_token_ids == [256]
    assert r.json()["choices"][0]["message"]["content"] == "hi"


def test_stop_string_spanning_a_bpe_token_boundary(folder):
    tok = load_tokenizer(folder)
    ids = tok.encode("The quick brown fox jumps over the lazy dog")
    pieces = [tok.decode([t]) for t in ids]
    i = next(k for k in range(1, len(ids)) if len(pieces[k - 1]) >= 2 and len(pieces[k]) >= 2)
    stop = pieces[i - 1][-2:] + pieces[i][:2]  # ends one token, begins the next
    req = Request("r", [1], max_tokens=64, sampling=SamplingParams(stop=[stop]))
    req.output_token_ids = list(ids[:i])
    assert safe_to_emit(req, tok.decode) == i - 1  # the token whose text begins the stop waits
    req.output_token_ids = list(ids)
    assert cut_at_stop_string(req, tok.decode)
    assert req.output_token_ids == ids[: i - 1]
    assert stop not in tok.decode(req.output_token_ids)
