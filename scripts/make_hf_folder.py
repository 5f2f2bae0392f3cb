#!/usr/bin/env python
"""Write a tiny HuggingFace model folder with RANDOM weights, of any family the engine serves.

The folder is not a model: its weights are drawn from a seeded generator, so what it generates
is noise. It is for trying out loading and serving (config.json, safetensors weights, the MTP
layers under their released names, generation_config.json, with --tokenizer a byte-level BPE
tokenizer.json and tokenizer_config.json), built with transformers' own model classes by the
builders the tests use (tests/support). Needs torch and transformers (the test extra);
--size-mb needs neither.

Families (--family): llama, qwen2, qwen3, mimo, deepseek-v3 (MLA + MoE), glm-4.5 (MoE),
ernie-4.5 (dense), ernie-4.5-moe, qwen3-next (Gated DeltaNet + gated attention, MoE),
qwen3.5 (Qwen3.5 text, dense). --tie, --rope-type, --dtype and --legacy-config apply to
llama, qwen2, qwen3 and mimo (--tie to ERNIE too); a family they do not apply to refuses them.

Examples::

    python scripts/make_hf_folder.py --family qwen3 --out /tmp/qwen3-tiny --mtp-layers 2 --tokenizer
    python scripts/make_hf_folder.py --family deepseek-v3 --out /tmp/dsv3-tiny --tokenizer
    python scripts/make_hf_folder.py --family mimo --out /tmp/mimo-tiny --rope-type yarn
    python scripts/make_hf_folder.py --family qwen3 --out /tmp/qwen3-big --size-mb 200
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import (  # noqa: E402
    hf_ernie_folders,
    hf_hybrid_folders,
    hf_mla_folders,
    hf_moe_folders,
)
from tests.support.hf_folders import FAMILIES, make_big_folder, make_folder, rope_example  # noqa: E402
from tests.support.tokenizer_files import write_bpe_tokenizer  # noqa: E402

#: the tokenizer --tokenizer writes: 300 ids, as many as every family's vocabulary here
TOKENIZER_IDS = 300

#: the families beyond :data:`FAMILIES`, each with its builder(out, args)
_BUILDERS: dict[str, Callable[[Path, argparse.Namespace], object]] = {
    "deepseek-v3": lambda out, a: hf_mla_folders.make_mla_folder(
        out, num_mtp_layers=a.mtp_layers, seed=a.seed
    ),
    "glm-4.5": lambda out, a: hf_moe_folders.make_glm_folder(
        out, num_mtp_layers=a.mtp_layers, seed=a.seed
    ),
    "ernie-4.5": lambda out, a: hf_ernie_folders.make_ernie_folder(
        out, moe=False, num_mtp_layers=a.mtp_layers, tie=a.tie, seed=a.seed
    ),
    "ernie-4.5-moe": lambda out, a: hf_ernie_folders.make_ernie_folder(
        out, moe=True, num_mtp_layers=a.mtp_layers, tie=a.tie, seed=a.seed
    ),
    "qwen3-next": lambda out, a: hf_hybrid_folders.make_hybrid_folder(
        out, "qwen3_next", mtp_layers=a.mtp_layers, seed=a.seed
    ),
    "qwen3.5": lambda out, a: hf_hybrid_folders.make_hybrid_folder(
        out, "qwen3_5", mtp_layers=a.mtp_layers, seed=a.seed
    ),
}
#: every --family, in the order of the README's table
ALL_FAMILIES = (*FAMILIES, *_BUILDERS)
#: the options only the families of :data:`FAMILIES` take (and ERNIE --tie), with their defaults
_DENSE_ONLY = {"rope_type": "default", "dtype": "float32", "legacy_config": False, "tie": False}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--family", choices=ALL_FAMILIES, required=True)
    p.add_argument("--out", type=Path, required=True, help="new or empty directory")
    p.add_argument("--mtp-layers", type=int, default=1, help="MTP layers (0 = none; default 1)")
    p.add_argument("--tokenizer", action="store_true", help="also write tokenizer files")
    p.add_argument("--tie", action="store_true", help="tie the LM head to the embedding")
    p.add_argument(
        "--rope-type", choices=("default", "linear", "dynamic", "yarn", "llama3"), default="default"
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="what the safetensors hold (default float32)",
    )
    p.add_argument("--seed", type=int, default=0, help="the weights' random seed (default 0)")
    p.add_argument(
        "--legacy-config", action="store_true", help="config.json in the transformers-4 form"
    )
    p.add_argument(
        "--size-mb", type=int, help="a plain qwen3-shaped float32 folder of about this size instead"
    )
    return p


def _build(args: argparse.Namespace, p: argparse.ArgumentParser) -> Any:
    """Write the folder ``args`` ask for (refusing options its family does not take)."""
    if args.mtp_layers < 0:
        p.error(f"--mtp-layers must be >= 0, got {args.mtp_layers}")
    if args.size_mb is not None:
        if args.family != "qwen3":
            p.error("--size-mb writes a qwen3-shaped folder: pass --family qwen3")
        return make_big_folder(args.out, args.size_mb, seed=args.seed)
    if args.family in FAMILIES:
        return make_folder(
            args.out,
            args.family,
            num_mtp_layers=args.mtp_layers,
            tie=args.tie,
            rope_scaling=None if args.rope_type == "default" else rope_example(args.rope_type),
            dtype=args.dtype,
            seed=args.seed,
            legacy_config=args.legacy_config,
        )
    taken = {"tie"} if args.family.startswith("ernie") else set()
    for name, default in _DENSE_ONLY.items():
        if name not in taken and getattr(args, name) != default:
            flag = "--" + name.replace("_", "-")
            p.error(f"{flag} applies to {', '.join(FAMILIES)}, not to --family {args.family}")
    return _BUILDERS[args.family](args.out, args)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    _build(args, p)
    if args.tokenizer:
        write_bpe_tokenizer(str(args.out), vocab_size=TOKENIZER_IDS)
    config = json.loads((args.out / "config.json").read_text())
    mtp = config.get(
        "num_nextn_predict_layers", config.get("mtp_num_hidden_layers", args.mtp_layers)
    )
    print(
        f"{args.out}: {args.family} with random weights ({config['architectures'][0]}, "
        f"{config['num_hidden_layers']} layers, {mtp} MTP layers)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
