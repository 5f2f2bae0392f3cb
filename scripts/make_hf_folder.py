#!/usr/bin/env python
"""Write a tiny random HuggingFace model folder (config.json, safetensors, MTP layers under
their released names, generation_config.json), built with transformers' own model classes.
Needs torch and transformers (the test dependencies); ``--size-mb`` needs neither.

Examples::

    python scripts/make_hf_folder.py --family qwen3 --out /tmp/qwen3_tiny --mtp-layers 1
    python scripts/make_hf_folder.py --family mimo --out /tmp/mimo_tiny --rope-type yarn --tokenizer
    python scripts/make_hf_folder.py --family qwen3 --out /tmp/qwen3_big --size-mb 200
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.hf_folders import FAMILIES, make_big_folder, make_folder, rope_example  # noqa: E402


def _tokenizer_writer(vocab_size: int):
    """The test tokenizer's writer (tests/support/tokenizer_files.py): a byte-level BPE whose
    ids 0, 1, 2 are <|endoftext|>, <|im_start|>, <|im_end|>."""
    try:
        from tests.support.tokenizer_files import write_bpe_tokenizer  # type: ignore[import-not-found]
    except ImportError as exc:
        raise SystemExit(
            f"--tokenizer: tests/support/tokenizer_files.py has no write_bpe_tokenizer ({exc})"
        ) from exc
    return lambda out: write_bpe_tokenizer(str(out), vocab_size=vocab_size)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=FAMILIES, required=True)
    p.add_argument("--out", type=Path, required=True, help="new or empty directory")
    p.add_argument("--mtp-layers", type=int, default=1, help="MTP layers (0 = none)")
    p.add_argument("--tokenizer", action="store_true", help="also write tokenizer files")
    p.add_argument("--tie", action="store_true", help="tie the LM head to the embedding")
    p.add_argument(
        "--rope-type", choices=("default", "linear", "dynamic", "yarn", "llama3"), default="default"
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--legacy-config", action="store_true", help="config.json in the transformers-4 form"
    )
    p.add_argument(
        "--size-mb", type=int, help="a plain qwen3-shaped float32 folder of about this size instead"
    )
    args = p.parse_args(argv)
    if args.size_mb is not None:
        if args.family != "qwen3":
            p.error("--size-mb writes a qwen3-shaped folder: pass --family qwen3")
        info = make_big_folder(args.out, args.size_mb, seed=args.seed)
    else:
        info = make_folder(
            args.out,
            args.family,
            num_mtp_layers=args.mtp_layers,
            tie=args.tie,
            rope_scaling=None if args.rope_type == "default" else rope_example(args.rope_type),
            dtype=args.dtype,
            seed=args.seed,
            tokenizer_writer=_tokenizer_writer(300) if args.tokenizer else None,
            legacy_config=args.legacy_config,
        )
    n_tensors = len(info.target_tensor_names) + len(info.mtp_tensor_names)
    print(
        f"{info.path}: {info.family}, {info.num_hidden_layers} layers, "
        f"{info.num_mtp_layers} MTP layers, {n_tensors} tensors, "
        f"{'sharded' if info.sharded else 'one file'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
