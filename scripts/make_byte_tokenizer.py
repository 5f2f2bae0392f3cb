"""Write the shipped byte model's tokenizer files into fastdeploy_mtp/assets (or --out DIR):

* ``tokenizer.json``: ids 0..255 are the bytes of the UTF-8 text. Built with the
  ``tokenizers`` library: a byte-level pre-tokenizer (no prefix space, no regex split) maps
  each byte to its stand-in character, a BPE model with those 256 characters as its
  vocabulary (id = byte value) and no merges emits one token per byte, and the byte-level
  decoder maps them back (invalid UTF-8 becomes U+FFFD). Id 256 is the special token
  ``<|endoftext|>`` that ends each training document (the model's EOS; decoding skips it).
* ``tokenizer_config.json``: ``<|endoftext|>`` as ``eos_token`` (no BOS) and a chat template
  rendering one line per message, ``"<role>: <content>"``, then ``"assistant:"`` (nothing
  after a message: the model ends its answer with ``<|endoftext|>`` itself).

    python scripts/make_byte_tokenizer.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from fastdeploy_mtp.tokenization import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, byte_level_chars

ASSETS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fastdeploy_mtp", "assets"
)

#: One line per message, then the assistant's turn (what the byte model was served with).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
#: The end-of-text token, id 256 (the first id after the bytes).
EOT_TOKEN = "<|endoftext|>"


def byte_tokenizer() -> Tokenizer:
    vocab = {c: b for b, c in enumerate(byte_level_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT_TOKEN, special=True, normalized=False)])
    if tok.token_to_id(EOT_TOKEN) != len(vocab):
        raise RuntimeError(f"{EOT_TOKEN} got id {tok.token_to_id(EOT_TOKEN)}, not {len(vocab)}")
    return tok


def tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOT_TOKEN,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", default=ASSETS, help="folder to write into (default: the shipped assets)"
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    byte_tokenizer().save(os.path.join(args.out, TOKENIZER_FILE), pretty=True)
    with open(os.path.join(args.out, TOKENIZER_CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {TOKENIZER_FILE} and {TOKENIZER_CONFIG_FILE} to {args.out}")


if __name__ == "__main__":
    main()
