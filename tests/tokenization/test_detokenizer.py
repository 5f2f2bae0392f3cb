"""IncrementalDetokenizer: the streamed pieces put together equal ``decode(all ids)``,
whatever the ids and however they arrive; a piece never ends inside a character (never in
U+FFFD before the end); special tokens and padded ids have no text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from fastdeploy_mtp.models import ASSETS_DIR
from fastdeploy_mtp.tokenization import IncrementalDetokenizer, load_tokenizer
from tests.support.tokenizer_files import write_bpe_tokenizer

BYTE_TOK = load_tokenizer(ASSETS_DIR)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    # a larger vocabulary: merges join bytes of multi-byte characters, some partially
    return load_tokenizer(write_bpe_tokenizer(str(tmp_path_factory.mktemp("bpe")), vocab_size=520))


def stream(tok, ids, cuts, skip=True):
    det = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    pieces, start = [], 0
    for end in [*sorted(set(cuts)), len(ids)]:
        end = min(end, len(ids))
        if end > start:
            pieces.append(det.add(ids[start:end]))
            start = end
    pieces.append(det.finish())
    assert det.text == "".join(pieces)
    return pieces


def check(tok, ids, cuts, skip=True):
    pieces = stream(tok, ids, cuts, skip)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    # only the final piece may end in an incomplete character
    assert not any(p.endswith("\ufffd") for p in pieces[:-1])


def test_partial_characters_wait_for_their_last_byte():
    det = IncrementalDetokenizer(BYTE_TOK)
    euro = list("€".encode())
    assert det.add(euro[:1]) == "" and det.add(euro[1:2]) == ""
    assert det.add(euro[2:]) == "€"
    assert det.add([ord("a")]) == "a"
    assert det.add([0xE2]) == ""
    assert det.finish() == "\ufffd"  # released at the end, as the full decode has it


def test_an_invalid_byte_is_released_once_the_next_character_comes():
    det = IncrementalDetokenizer(BYTE_TOK)
    assert det.add([0xE2, 0x82]) == ""
    assert det.add([ord("b")]) == "\ufffdb"


def test_padded_ids_and_special_tokens_have_no_text(bpe):
    det = IncrementalDetokenizer(BYTE_TOK)
    assert det.add([260, 261]) == "" and det.add([104, 271, 105]) == "hi"
    ids = bpe.encode("<|im_start|>assistant\nhi<|im_end|>")
    assert "".join(stream(bpe, ids, range(len(ids)))) == "assistant\nhi"
    assert (
        "".join(stream(bpe, ids, range(len(ids)), skip=False))
        == "<|im_start|>assistant\nhi<|im_end|>"
    )


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40), cuts=st.lists(st.integers(0, 60), max_size=8))
def test_bpe_stream_equals_full_decode_of_text(bpe, text, cuts):
    ids = bpe.encode(text)
    check(bpe, ids, cuts)
    assert "".join(stream(bpe, ids, cuts)) == text


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(0, 540), max_size=40), cuts=st.lists(st.integers(0, 40), max_size=8)
)
def test_bpe_stream_equals_full_decode_of_any_ids(bpe, ids, cuts):
    # any ids: split characters, invalid UTF-8, special tokens, ids past the vocabulary
    check(bpe, ids, cuts)
    check(bpe, ids, cuts, skip=False)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=40), cuts=st.lists(st.integers(0, 40), max_size=8))
def test_byte_stream_equals_full_decode(raw, cuts):
    check(BYTE_TOK, list(raw), cuts)
    assert "".join(stream(BYTE_TOK, list(raw), cuts)) == raw.decode("utf-8", errors="replace")
