"""load_tokenizer and load_generation_config: what they read from a folder, and the one-line
errors naming the file when something is missing or malformed."""

from __future__ import annotations

import json

import pytest

from fastdeploy_mtp.tokenization import (
    GenerationDefaults,
    TokenizerFileError,
    load_generation_config,
    load_tokenizer,
)
from tests.support.tokenizer_files import write_bpe_tokenizer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_bpe_tokenizer(str(tmp_path_factory.mktemp("tok")))


def _config(path):
    with open(path / "tokenizer_config.json") as f:
        return json.load(f)


def _rewrite_config(path, **changes):
    config = {**_config(path), **changes}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def test_reads_special_tokens_eos_and_vocab(folder):
    tok = load_tokenizer(folder)
    assert tok.vocab_size == 300
    assert tok.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert tok.eos_token_ids == [tok.backend.token_to_id("<|im_end|>")] == [2]
    assert tok.decode([2, *tok.encode("ok"), 299, 300, 5000]) == "ok" + tok.decode([299])


def test_token_strings_and_bytes_of_bpe_tokens(folder):
    tok = load_tokenizer(folder)
    for text in ["The café", "日本語", " 🎉"]:
        ids = tok.encode(text)
        assert b"".join(bytes(tok.token_bytes(t)) for t in ids) == text.encode()
        assert all(tok.token_string(t) == tok.decode([t]) for t in ids)
    assert tok.token_string(2) == "<|im_end|>" and tok.token_bytes(2) == list(b"<|im_end|>")
    assert tok.token_string(300) == "" and tok.token_bytes(300) == []


def test_tokenizer_dir_overrides_the_model_folder(folder, tmp_path):
    assert load_tokenizer(str(tmp_path), tokenizer_dir=folder).vocab_size == 300


def test_missing_tokenizer_json_names_the_file(tmp_path):
    with pytest.raises(TokenizerFileError, match=r"tokenizer\.json: no such file"):
        load_tokenizer(str(tmp_path))


@pytest.mark.parametrize(
    "file, content, match",
    [
        ("tokenizer.json", "{not json", r"tokenizer\.json: not a valid tokenizer\.json"),
        ("tokenizer_config.json", "{not json", r"tokenizer_config\.json: cannot read it as JSON"),
        (
            "tokenizer_config.json",
            "[1, 2]",
            r"tokenizer_config\.json: expected a JSON object, got list",
        ),
        (
            "tokenizer_config.json",
            '{"eos_token": 5}',
            r"tokenizer_config\.json: `eos_token` must be a string",
        ),
        (
            "tokenizer_config.json",
            '{"chat_template": 3}',
            r"`chat_template` must be a string or a list",
        ),
        (
            "tokenizer_config.json",
            '{"chat_template": [{"name": "tool_use", "template": "x"}]}',
            r"lists templates \['tool_use'\] but no 'default'",
        ),
    ],
)
def test_malformed_files_name_the_file(tmp_path, file, content, match):
    write_bpe_tokenizer(str(tmp_path))
    (tmp_path / file).write_text(content)
    with pytest.raises(TokenizerFileError, match=match) as err:
        load_tokenizer(str(tmp_path))
    assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


def test_named_templates_take_default_and_jinja_file_wins(tmp_path):
    write_bpe_tokenizer(str(tmp_path))
    named = [
        {"name": "default", "template": "D{{ messages[0]['content'] }}"},
        {"name": "rag", "template": "R"},
    ]
    _rewrite_config(tmp_path, chat_template=named)
    assert (
        load_tokenizer(str(tmp_path)).apply_chat_template([{"role": "user", "content": "x"}])
        == "Dx"
    )
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    assert (
        load_tokenizer(str(tmp_path)).apply_chat_template([{"role": "user", "content": "x"}])
        == "J1"
    )


def test_no_chat_template_is_a_clear_error(tmp_path):
    write_bpe_tokenizer(str(tmp_path))
    _rewrite_config(tmp_path, chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        load_tokenizer(str(tmp_path)).apply_chat_template([{"role": "user", "content": "x"}])


def test_added_tokens_decoder_adds_missing_tokens_at_their_ids(tmp_path):
    write_bpe_tokenizer(str(tmp_path))
    extra = {
        "300": {"content": "<think>", "special": False},
        "301": {"content": "<|tool|>", "special": True},
    }
    _rewrite_config(tmp_path, added_tokens_decoder=extra)
    tok = load_tokenizer(str(tmp_path))
    assert tok.vocab_size == 302
    assert tok.encode("a<think>b<|tool|>")[1:] == [300, tok.encode("b")[0], 301]
    assert tok.decode(tok.encode("<think><|tool|>")) == "<think>"  # the special one is skipped
    _rewrite_config(tmp_path, added_tokens_decoder={"350": {"content": "<gap>", "special": True}})
    with pytest.raises(
        TokenizerFileError, match=r"'<gap>' is declared as id 350 but lands at id 300"
    ):
        load_tokenizer(str(tmp_path))


def test_generation_config_defaults(tmp_path):
    assert load_generation_config(str(tmp_path)) == GenerationDefaults()
    body = {
        "eos_token_id": [151645, 151643],
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "do_sample": True,
    }
    (tmp_path / "generation_config.json").write_text(
        json.dumps({**body, "repetition_penalty": 1.05})
    )
    got = load_generation_config(str(tmp_path))
    assert got.eos_token_ids == [151645, 151643]
    assert got.sampling_overrides() == {
        "temperature": 0.7,
        "top_p": 0.8,
        "top_k": 20,
        "repetition_penalty": 1.05,
    }
    assert got.min_p is None and got.max_new_tokens is None
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": 2, "max_new_tokens": 128})
    )
    got = load_generation_config(str(tmp_path))
    assert (got.eos_token_ids, got.max_new_tokens, got.sampling_overrides()) == ([2], 128, {})


@pytest.mark.parametrize(
    "content, match",
    [
        ("[]", "expected a JSON object, got list"),
        ('{"temperature": "hot"}', "`temperature` must be a number, got 'hot'"),
        ('{"top_k": 2.5}', "`top_k` must be an integer"),
        ('{"eos_token_id": [1, -2]}', "`eos_token_id` must be a token id or a list of them"),
    ],
)
def test_malformed_generation_config_names_the_file(tmp_path, content, match):
    (tmp_path / "generation_config.json").write_text(content)
    with pytest.raises(ValueError, match=match) as err:
        load_generation_config(str(tmp_path))
    assert "generation_config.json" in str(err.value)
