"""What the structured-output tests on the shipped checkpoint share: its byte tokenizer, its
padded vocabulary and end-of-text id, and a JSON schema its answers can satisfy."""

from __future__ import annotations

from fastdeploy_mtp.models import ByteTokenizer

TOK = ByteTokenizer()
# the shipped model's padded vocabulary and its EOS, <|endoftext|> (build_config's end id)
V, EOS = 272, 256
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n", "ok"],
    "additionalProperties": False,
}
