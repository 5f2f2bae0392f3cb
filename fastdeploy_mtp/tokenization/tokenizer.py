"""A model folder's tokenizer: ``tokenizer.json`` (run by the ``tokenizers`` library) with
the settings of ``tokenizer_config.json`` (special tokens, added tokens, the chat template;
``chat_template.jinja`` when the folder has one), as HuggingFace transformers reads them.

What encoding adds around a text (BOS for Llama-style models) is ``tokenizer.json``'s
post-processor: like transformers (5.x) with a ``tokenizer.json``, ``add_bos_token`` /
``add_eos_token`` in ``tokenizer_config.json`` do not override it.

Token ids are plain ``int``; a model's vocabulary may be padded past the tokenizer's: ids
``>= vocab_size`` (or ids the vocabulary lacks) have no text and are left out of every
decode.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

import tokenizers

from .chat_template import render_chat_template

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: The special-token entries of ``tokenizer_config.json`` a chat template sees by name.
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenizerFileError(ValueError):
    """A tokenizer file that is missing or malformed (the message names the file)."""


def byte_level_chars() -> list[str]:
    """The character that stands for each byte ``0..255`` in a byte-level BPE vocabulary
    (GPT-2's mapping): the printable Latin-1 bytes stand for themselves, the other 68 bytes
    for U+0100, U+0101, ... in byte order."""
    kept = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars: list[str] = []
    extra = 0
    for b in range(256):
        if b in kept:
            chars.append(chr(b))
        else:
            chars.append(chr(0x100 + extra))
            extra += 1
    return chars


_BYTE_OF_CHAR = {c: b for b, c in enumerate(byte_level_chars())}


def _decoder_types(backend: tokenizers.Tokenizer) -> set[str]:
    """The ``type`` names of the backend's decoder (the members of a ``Sequence`` too)."""
    if backend.decoder is None:
        return set()
    spec = json.loads(backend.decoder.__getstate__())
    members = spec.get("decoders", []) if spec.get("type") == "Sequence" else [spec]
    return {str(m.get("type")) for m in members}


class Tokenizer:
    """Text <-> token ids for one model.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` of ``tokenizer.json``.
        vocab_size: one past the largest token id (added tokens included).
        special_tokens: ``{"bos_token": "<s>", ...}`` as ``tokenizer_config.json`` names them.
        chat_template: the Jinja2 source, or ``None`` when the folder has none.
        eos_token_ids: ``[id of eos_token]``, or ``[]`` when there is none.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        special_tokens: dict[str, str] | None = None,
        chat_template: str | None = None,
        source: str = "",
    ):
        self.backend = backend
        self.special_tokens = dict(special_tokens or {})
        self.chat_template = chat_template
        self.source = source
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1
        self._added = backend.get_added_tokens_decoder()
        eos = (
            backend.token_to_id(self.special_tokens["eos_token"])
            if "eos_token" in self.special_tokens
            else None
        )
        self.eos_token_ids: list[int] = [] if eos is None else [int(eos)]
        types = _decoder_types(backend)
        self._byte_level = "ByteLevel" in types
        self._byte_fallback = bool(getattr(backend.model, "byte_fallback", False))

    def _known(self, ids: Sequence[int]) -> list[int]:
        return [int(t) for t in ids if 0 <= int(t) < self.vocab_size]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text`` as token ids (``int64``-range ints); ``add_special_tokens`` adds what the
        tokenizer's post-processor adds (e.g. BOS when ``add_bos_token``)."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (invalid UTF-8 becomes U+FFFD); ids past the vocabulary are
        left out, special tokens too unless ``skip_special_tokens`` is False."""
        return str(self.backend.decode(self._known(ids), skip_special_tokens=skip_special_tokens))

    def token_string(self, token_id: int) -> str:
        """The token decoded alone (special tokens included; a token holding part of a UTF-8
        character is U+FFFD); ``""`` for an id past the vocabulary."""
        return self.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> list[int]:
        """The bytes the token stands for (a byte-level or byte-fallback token's raw bytes,
        else its text as UTF-8); ``[]`` for an id past the vocabulary."""
        if not 0 <= token_id < self.vocab_size:
            return []
        if token_id in self._added:
            return list(self._added[token_id].content.encode("utf-8"))
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            return []
        if self._byte_level and all(c in _BYTE_OF_CHAR for c in piece):
            return [_BYTE_OF_CHAR[c] for c in piece]
        match = _BYTE_TOKEN.fullmatch(piece)
        if self._byte_fallback and match is not None:
            return [int(match.group(1), 16)]
        return list(piece.replace("\u2581", " ").encode("utf-8"))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kw: Any
    ) -> str:
        """The prompt text of a chat (``[{"role", "content"}]``), rendered by the tokenizer's
        chat template with its special tokens (tokenize it with ``add_special_tokens=False``).

        Raises:
            ValueError: the tokenizer has no chat template (names the files looked at).
            ChatTemplateError: the template refused the messages.
        """
        if self.chat_template is None:
            raise ValueError(
                f"{self.source}: no chat template ({TOKENIZER_CONFIG_FILE} has no `chat_template` "
                f"and there is no {CHAT_TEMPLATE_FILE})"
            )
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens,
            **kw,
        )


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise TokenizerFileError(
            f"{path}: cannot read it as JSON ({' '.join(str(exc).split())})"
        ) from None
    if not isinstance(data, dict):
        raise TokenizerFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_text(value: Any, key: str, path: str) -> str | None:
    """A special token entry: a string, ``{"content": str, ...}`` (an AddedToken) or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerFileError(
        f"{path}: `{key}` must be a string, an object with `content`, or null; got {value!r}"
    )


def _chat_template(folder: str, config: dict[str, Any], path: str) -> str | None:
    jinja_path = os.path.join(folder, CHAT_TEMPLATE_FILE)
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read()
    value = config.get("chat_template")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return str(named["default"])
        raise TokenizerFileError(
            f"{path}: `chat_template` lists templates {sorted(map(str, named))} but no 'default'"
        )
    raise TokenizerFileError(
        f"{path}: `chat_template` must be a string or a list of named templates"
    )


def _add_declared_tokens(backend: tokenizers.Tokenizer, config: dict[str, Any], path: str) -> None:
    """Add the ``added_tokens_decoder`` entries ``tokenizer.json`` lacks, at their ids."""
    declared = config.get("added_tokens_decoder") or {}
    if not isinstance(declared, dict):
        raise TokenizerFileError(f"{path}: `added_tokens_decoder` must be an object of id -> token")
    for key, entry in sorted(declared.items(), key=lambda kv: int(kv[0])):
        content = _token_text(entry, f"added_tokens_decoder.{key}", path)
        if content is None or backend.token_to_id(content) is not None:
            continue
        flags = {k: bool(entry.get(k, False)) for k in ("single_word", "lstrip", "rstrip")}
        token = tokenizers.AddedToken(
            content,
            normalized=bool(entry.get("normalized", False)),
            special=bool(entry.get("special")),
            **flags,
        )
        if entry.get("special"):
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        if backend.token_to_id(content) != int(key):
            got = backend.token_to_id(content)
            raise TokenizerFileError(
                f"{path}: added token {content!r} is declared as id {key} but lands at id {got}"
            )


def load_tokenizer(model_dir: str, tokenizer_dir: str | None = None) -> Tokenizer:
    """The tokenizer of a model folder (or of ``tokenizer_dir``, when given): its
    ``tokenizer.json`` and, when present, ``tokenizer_config.json`` and ``chat_template.jinja``.

    Raises:
        TokenizerFileError: ``tokenizer.json`` is missing or unreadable, or
            ``tokenizer_config.json`` malformed (names the file and what is wrong).
    """
    folder = tokenizer_dir or model_dir
    path = os.path.join(folder, TOKENIZER_FILE)
    if not os.path.isfile(path):
        raise TokenizerFileError(
            f"{path}: no such file (the tokenizer folder needs a {TOKENIZER_FILE})"
        )
    try:
        backend = tokenizers.Tokenizer.from_file(path)
    except Exception as exc:  # the library raises plain Exception for a malformed file
        raise TokenizerFileError(
            f"{path}: not a valid {TOKENIZER_FILE} ({' '.join(str(exc).split())})"
        ) from None
    config_path = os.path.join(folder, TOKENIZER_CONFIG_FILE)
    config = _read_json(config_path) if os.path.isfile(config_path) else {}
    special: dict[str, str] = {}
    for key in SPECIAL_TOKEN_KEYS:
        text = _token_text(config.get(key), key, config_path)
        if text is not None:
            special[key] = text
    _add_declared_tokens(backend, config, config_path)
    return Tokenizer(backend, special, _chat_template(folder, config, config_path), folder)
