"""The shipped byte model's tokenizer files: ``tokenizer.json`` encodes and decodes exactly as
the byte model's :class:`~fastdeploy_mtp.models.ByteTokenizer` (ids 0..255 = the UTF-8 bytes,
invalid UTF-8 decoded the same way), id 256 is the special ``<|endoftext|>`` (the EOS, left
out of decoded text), padded ids have no text, and the chat template renders one line per
message then ``assistant:``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from fastdeploy_mtp.models import ASSETS_DIR, ByteTokenizer, load_tiny
from fastdeploy_mtp.tokenization import load_tokenizer

TOK = load_tokenizer(ASSETS_DIR)
BYTES = ByteTokenizer()

EDGE_TEXTS = [
    "",
    "hello world",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\n",
    "\x00\x01\x7f control",
    "café naïve Zürich",
    "日本語のテキスト",
    "emoji 🎉🚀 and a ZWJ 👩\u200d💻",
    "Ā ā Ġ ĉ",  # characters byte-level BPE uses as stand-ins for bytes
    "<|im_end|> <s> </s>",  # no special tokens: plain text
    "\ufffd replacement char",
]

INVALID_UTF8 = [
    b"\xe2\x82",  # truncated 3-byte character
    b"a\xe2\x82b",
    b"\xff\xfe\xfd",
    b"\xf0\x9f\x8e",  # truncated 4-byte character
    b"\xed\xa0\x80",  # a UTF-16 surrogate encoded
    b"\xc0\xaf",  # overlong
    b"\xe2\x82\xe2\x82\xac",
    b"\x80abc\xbf",
    b"\xf4\x90\x80\x80",  # past U+10FFFF
]


@pytest.mark.parametrize("text", EDGE_TEXTS)
def test_encode_decode_equal_the_byte_tokenizer(text):
    ids = TOK.encode(text)
    assert ids == BYTES.encode(text)
    assert TOK.decode(ids) == text


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_encodes_to_its_utf8_bytes(text):
    assert TOK.encode(text) == list(text.encode("utf-8"))
    assert TOK.decode(TOK.encode(text)) == text


@pytest.mark.parametrize("raw", INVALID_UTF8)
def test_invalid_utf8_decodes_as_the_byte_tokenizer(raw):
    assert TOK.decode(list(raw)) == BYTES.decode(list(raw)) == raw.decode("utf-8", errors="replace")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_any_bytes_decode_as_python_replace(raw):
    assert TOK.decode(list(raw)) == raw.decode("utf-8", errors="replace")


def test_padded_ids_have_no_text():
    arch = load_tiny()[2]
    assert TOK.vocab_size == arch.ori_vocab_size == 257
    padded = list(range(arch.ori_vocab_size, arch.vocab_size))
    assert TOK.decode([104, *padded, 105]) == "hi"
    assert all(TOK.token_string(t) == "" and TOK.token_bytes(t) == [] for t in padded)


def test_end_of_text_is_the_eos_and_has_no_text():
    arch = load_tiny()[2]
    assert TOK.eos_token_ids == arch.eos_token_ids == [BYTES.eos_token_id] == [256]
    assert TOK.special_tokens["eos_token"] == TOK.token_string(256) == "<|endoftext|>"
    assert TOK.decode([104, 256, 105]) == BYTES.decode([104, 256, 105]) == "hi"
    assert TOK.decode([104, 256], skip_special_tokens=False) == "h<|endoftext|>"
    # like every HF tokenizer, the special token's text in a prompt is the token
    assert TOK.encode("a<|endoftext|>") == [97, 256]


def test_token_strings_and_bytes_are_the_byte_tokenizers():
    for t in range(256):
        assert TOK.token_bytes(t) == [t]
        assert TOK.token_string(t) == bytes([t]).decode("utf-8", errors="replace")


def test_chat_template_renders_role_lines_then_assistant():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "déjà vu\nagain"},
    ]
    want = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    assert TOK.apply_chat_template(messages) == want
    assert (
        TOK.apply_chat_template(messages, add_generation_prompt=False) == want[: -len("assistant:")]
    )


def test_the_script_writes_the_shipped_files(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    script = os.path.join(root, "scripts", "make_byte_tokenizer.py")
    subprocess.run(
        [sys.executable, script, "--out", str(tmp_path)], check=True, env=env, capture_output=True
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(tmp_path / name) as written, open(os.path.join(ASSETS_DIR, name)) as shipped:
            assert json.load(written) == json.load(shipped), name
