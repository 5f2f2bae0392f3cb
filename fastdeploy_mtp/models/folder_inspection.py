"""Inspect a HuggingFace-layout model folder before anything loads: ``config.json`` (+
``generation_config.json``), ``tokenizer.json``'s vocabulary, and the headers of
``model.safetensors`` or of ``model.safetensors.index.json``'s shards.

:func:`inspect_model_folder` reads only those JSON files and headers and checks that every
tensor the model needs is there with the right shape and a supported dtype, so a folder that
cannot be served is refused in one line before a process starts. Paddle is imported only to
ask whether a half-precision folder can run on this device.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .hf_config import UnsupportedModelError, translate_config
from .model_config import TINY_MODEL_TYPE, ModelConfig
from .weight_maps import WeightRef, ignorable, weight_map

#: The shipped tiny checkpoint: a model folder like any other, inside the package.
ASSETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
CONFIG_JSON = "config.json"
GENERATION_JSON = "generation_config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: safetensors dtype -> numpy dtype as stored (BF16 is read as its raw 16 bits).
STORED_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: ``file``, safetensors ``dtype``, ``shape`` and the absolute
    byte ``offset`` of its data."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class FolderPlan:
    """What :func:`inspect_folder` found: the config, the weight map and every tensor's entry."""

    config: ModelConfig
    refs: list[WeightRef]
    tensors: dict[str, TensorEntry]
    #: set when ``dtype="auto"`` widened the config's half precision to float32 (on the CPU)
    note: str | None = None


def _read_json(path: str, where: str, what: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        problem = f"{what} is not valid JSON ({exc.msg}, line {exc.lineno})"
        raise UnsupportedModelError(f"model folder {where}: {problem}") from None
    if not isinstance(data, dict):
        raise UnsupportedModelError(f"model folder {where}: {what} must hold a JSON object")
    return data


def _bad_file(path: str, what: str) -> UnsupportedModelError:
    """``model folder <dir>: <file>: <what>``, the one-line refusal of a bad weight file."""
    return UnsupportedModelError(
        f"model folder {os.path.dirname(path)}: {os.path.basename(path)}: {what}"
    )


def read_safetensors_header(path: str) -> dict[str, TensorEntry]:
    """The tensors of one ``.safetensors`` file (its JSON header only), each checked against
    the file: a header that is not JSON, a tensor entry without ``dtype``/``shape``/
    ``data_offsets``, a byte range whose length is not the shape's, or data past the end of
    the file (a truncated download) is refused in one line naming the file and the tensor."""
    file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise _bad_file(path, "shorter than its 8-byte header length")
        (size,) = struct.unpack("<Q", raw)
        if size > file_size - 8:
            raise _bad_file(path, f"header of {size} bytes runs past the end of the file")
        try:
            header = json.loads(f.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _bad_file(path, f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _bad_file(path, "header is not a JSON object")
    start = 8 + size
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(path, name, meta, start, file_size)
    return out


def _entry(path: str, name: str, meta: Any, start: int, file_size: int) -> TensorEntry:
    """One header entry as a :class:`TensorEntry`, its byte range checked."""
    try:
        dtype, shape = str(meta["dtype"]), tuple(int(d) for d in meta["shape"])
        begin, end = (int(x) for x in meta["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise _bad_file(
            path, f"tensor {name!r} has no valid dtype, shape and data_offsets"
        ) from None
    if dtype in STORED_DTYPES and (
        min(shape, default=1) < 0
        or end - begin != int(np.prod(shape)) * np.dtype(STORED_DTYPES[dtype]).itemsize
    ):
        raise _bad_file(
            path, f"tensor {name!r} has {end - begin} bytes for shape {list(shape)} of {dtype}"
        )
    if begin < 0 or start + end > file_size:
        raise _bad_file(
            path,
            f"tensor {name!r} ends at byte {start + end}, past the end of the file ({file_size} "
            "bytes; truncated?)",
        )
    return TensorEntry(path, dtype, shape, start + begin)


def _shard_files(path: str) -> list[str]:
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        weight_map = _read_json(index, path, INDEX_FILE).get("weight_map")
        if not isinstance(weight_map, dict):
            raise UnsupportedModelError(
                f"model folder {path}: {INDEX_FILE} has no `weight_map` object"
            )
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
        if missing:
            raise UnsupportedModelError(
                f"model folder {path}: shard {missing[0]} named in {INDEX_FILE} is missing"
            )
        return [os.path.join(path, f) for f in files]
    if os.path.isfile(os.path.join(path, SINGLE_FILE)):
        return [os.path.join(path, SINGLE_FILE)]
    raise UnsupportedModelError(f"model folder {path}: no {SINGLE_FILE} or {INDEX_FILE}")


def _check_tensors(
    path: str, config: ModelConfig, refs: list[WeightRef], tensors: dict[str, TensorEntry]
) -> None:
    for ref in refs:
        entry = tensors.get(ref.ckpt)
        if entry is None:
            raise UnsupportedModelError(
                f"model folder {path}: tensor {ref.ckpt!r} is missing (expected shape "
                f"{list(ref.ckpt_shape)})"
            )
        if entry.shape != ref.ckpt_shape:
            got, want = list(entry.shape), list(ref.ckpt_shape)
            raise UnsupportedModelError(
                f"model folder {path}: tensor {ref.ckpt!r} has shape {got}, expected {want}"
            )
        if entry.dtype not in STORED_DTYPES:
            raise UnsupportedModelError(
                f"model folder {path}: tensor {ref.ckpt!r} has dtype {entry.dtype}, expected one "
                f"of {sorted(STORED_DTYPES)}"
            )
    used = {r.ckpt for r in refs}
    extra = sorted(n for n in tensors if n not in used and not ignorable(config, n))
    if extra:
        raise UnsupportedModelError(
            f"model folder {path}: tensor {extra[0]!r} is not used by a {config.model_type} model "
            f"with num_nextn_predict_layers={config.num_nextn_predict_layers} ({len(extra)} unused "
            "tensor(s))"
        )


TOKENIZER_JSON = "tokenizer.json"


def tokenizer_vocab_size(where: str) -> int | None:
    """One past the largest id of the folder's ``tokenizer.json`` (added tokens included), or
    ``None`` when the folder has none. Raises ``UnsupportedModelError`` for an unreadable file."""
    path = os.path.join(where, TOKENIZER_JSON)
    if not os.path.isfile(path):
        return None
    from tokenizers import Tokenizer

    try:
        vocab = Tokenizer.from_file(path).get_vocab(with_added_tokens=True)
    except Exception as exc:  # the tokenizers library raises a bare Exception for a bad file
        raise UnsupportedModelError(
            f"model folder {where}: {TOKENIZER_JSON} cannot be read: {exc}"
        ) from None
    return max(vocab.values(), default=-1) + 1


def _unpad_vocab(config: ModelConfig, where: str) -> ModelConfig:
    """``config`` with ``ori_vocab_size`` = the folder tokenizer's vocabulary when the model's
    is padded beyond it (released checkpoints round the embedding up, e.g. to a multiple of
    128): the ids past the tokenizer have no text, so their logits are masked (``-inf``) and
    neither the target nor the MTP layer can produce them. The byte model keeps its own
    ``ori_vocab_size``; a folder without ``tokenizer.json`` is taken as unpadded."""
    if config.model_type == TINY_MODEL_TYPE:
        return config
    size = tokenizer_vocab_size(where)
    if size is None or size >= config.vocab_size:
        return config
    return dataclasses.replace(config, ori_vocab_size=size)


def folder_config(path: str | os.PathLike[str], dtype: str = "auto") -> ModelConfig:
    """The :class:`ModelConfig` the folder's JSON files and ``tokenizer.json`` describe
    (``config.json`` translated, ``generation_config.json``'s EOS ids, ``ori_vocab_size`` from the
    tokenizer); no tensor is looked at (:func:`inspect_model_folder` checks those too).

    Raises:
        UnsupportedModelError: one line naming the folder and what is missing or unsupported.
    """
    where = os.fspath(path)
    if not os.path.isdir(where):
        raise UnsupportedModelError(f"model folder {where}: not a directory")
    cfg_path = os.path.join(where, CONFIG_JSON)
    if not os.path.isfile(cfg_path):
        raise UnsupportedModelError(f"model folder {where}: no {CONFIG_JSON}")
    raw = _read_json(cfg_path, where, CONFIG_JSON)
    gen_path = os.path.join(where, GENERATION_JSON)
    generation = _read_json(gen_path, where, GENERATION_JSON) if os.path.isfile(gen_path) else None
    return _unpad_vocab(translate_config(raw, where, generation, dtype), where)


def inspect_folder(path: str | os.PathLike[str], dtype: str = "auto") -> FolderPlan:
    """Read the folder's JSON files and safetensors headers; see :func:`inspect_model_folder`."""
    where = os.fspath(path)
    config = folder_config(where, dtype)
    note = None
    if dtype == "auto" and config.dtype != "float32" and not half_precision_runs():
        note = (
            f"model folder {where}: its {config.dtype} weights run as float32 here (Paddle's CPU "
            f"kernels have no {config.dtype} matmul; --dtype float32 says so explicitly)"
        )
        config = dataclasses.replace(config, dtype="float32")
    check_dtype_runs(config, where)
    tensors: dict[str, TensorEntry] = {}
    for file in _shard_files(where):
        tensors.update(read_safetensors_header(file))
    refs = weight_map(config)
    _check_tensors(where, config, refs, tensors)
    return FolderPlan(config, refs, tensors, note)


def inspect_model_folder(path: str | os.PathLike[str], dtype: str = "auto") -> ModelConfig:
    """The :class:`ModelConfig` of a model folder, reading only JSON and safetensors headers.

    Args:
        path: the folder.
        dtype: ``"auto"`` (the config's ``dtype`` / ``torch_dtype``, float32 when absent),
            ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Raises:
        UnsupportedModelError: one line naming the folder and what is missing or unsupported
            (no ``config.json``, unknown architecture, an unsupported config key, a missing
            shard, a missing tensor or one of the wrong shape, an unused tensor).
    """
    return inspect_folder(path, dtype).config


def half_precision_runs() -> bool:
    """Whether this process's device has bfloat16 / float16 ``matmul`` kernels (Paddle's CPU
    build has none)."""
    import paddle

    return not paddle.get_device().startswith("cpu")


def check_dtype_runs(config: ModelConfig, where: str) -> None:
    """Refuse a half-precision ``config.dtype`` on the CPU: Paddle's CPU build has no
    bfloat16 / float16 ``matmul`` kernel."""
    if config.dtype != "float32" and not half_precision_runs():
        raise UnsupportedModelError(
            f"model folder {where}: dtype {config.dtype!r} needs a GPU (Paddle's CPU kernels have "
            f"no {config.dtype} matmul); load it with dtype='float32'"
        )
