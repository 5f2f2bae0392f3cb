"""``--model DIR`` (and ``serve DIR``), ``--tokenizer``, ``--dtype`` and ``--max-num-seqs``:
adding them to a command, and the model folder they name, checked before anything loads
(its config and weight headers are read; Paddle is not imported for a float32 folder)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..config import SpeculativeConfig
from .values import UsageError, positive_int


class _DeprecatedAlias(argparse.Action):
    """Store the value like the option it stands for, saying once on stderr which one that is."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option: str | None = None,
    ) -> None:
        print(f"fastdeploy-mtp: warning: {option} is deprecated; use --model", file=sys.stderr)
        setattr(namespace, self.dest, values)


#: ``--dtype`` choices: ``auto`` takes the folder's own (``config.json``'s ``torch_dtype`` or
#: ``dtype``; float32 when it names none).
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def add_model_arg(
    parser: argparse.ArgumentParser, deprecated: Sequence[str] = (), positional: bool = False
) -> None:
    """Add ``--model DIR`` (default: the shipped checkpoint), ``--tokenizer DIR`` and
    ``--dtype``; with ``positional``, also vLLM's ``serve DIR`` (an optional positional model
    folder); for each of ``deprecated``, an old spelling of ``--model`` that still works and
    prints a deprecation notice."""
    if positional:
        parser.add_argument(
            "model_dir",
            nargs="?",
            default=None,
            metavar="MODEL_DIR",
            help="model folder (the same as --model)",
        )
    parser.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="model folder (HuggingFace layout: config.json, safetensors, tokenizer; default: the "
        "shipped one)",
    )
    for flag in deprecated:
        parser.add_argument(
            flag,
            dest="model",
            action=_DeprecatedAlias,
            metavar="DIR",
            help="deprecated spelling of --model",
        )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="folder with tokenizer.json and tokenizer_config.json (default: the model folder)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="weights, activations and KV caches (default auto: the folder's config.json)",
    )


def model_arg(args: argparse.Namespace) -> str | None:
    """The model folder the arguments name: ``--model`` or the positional ``MODEL_DIR``
    (both may be given only if they agree); ``None`` = the shipped one."""
    positional = getattr(args, "model_dir", None)
    if positional is not None and args.model is not None and positional != args.model:
        raise UsageError(
            f"the model folder is given twice: {positional!r} and --model {args.model!r}"
        )
    return positional if positional is not None else args.model


def default_model() -> str:
    """The shipped tiny checkpoint's directory."""
    from ..models.folder_inspection import ASSETS_DIR

    return os.fspath(ASSETS_DIR)


def resolve_model(
    model: str | None, dtype: str = "auto", spec: SpeculativeConfig | None = None
) -> str:
    """The model folder (the shipped one when ``model`` is None), checked before anything
    loads or any process starts: its config and the headers of its weight files are read and
    every tensor the model needs must be there with its shape; with ``spec``, MTP speculation
    needs a folder with MTP layers.

    Raises:
        UsageError: no such folder, or a folder that cannot be served (one line naming what is
            missing or unsupported).
    """
    from ..models.folder_inspection import inspect_folder
    from ..models.hf_config import UnsupportedModelError

    path = model or default_model()
    if not os.path.isdir(path):
        raise UsageError(f"--model {path}: no such directory")
    try:
        plan = inspect_folder(path, dtype)
    except UnsupportedModelError as exc:
        raise UsageError(str(exc)) from None
    if plan.note:
        print(f"fastdeploy-mtp: note: {plan.note}", file=sys.stderr)
    if spec is not None and spec.uses_mtp and plan.config.num_nextn_predict_layers == 0:
        raise UsageError(
            f"model folder {path} has no MTP layer (config.json `num_nextn_predict_layers` is 0 or "
            f'absent): run it without MTP (--speculative-config \'{{"method": "none"}}\', or a '
            'model-free method: "ngram", "suffix", "naive")'
        )
    return path


def add_max_num_seqs_arg(
    parser: argparse.ArgumentParser, default: int | None, help_text: str
) -> None:
    """Add ``--max-num-seqs N`` (batch slots, > 0)."""
    parser.add_argument(
        "--max-num-seqs", type=positive_int, default=default, metavar="N", help=help_text
    )
