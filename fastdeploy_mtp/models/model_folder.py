"""Load a HuggingFace-layout model folder that :mod:`.folder_inspection` accepted.

:func:`load_model` builds the models (parameters in the config's dtype) and fills them shard
by shard: each tensor is memory-mapped, sliced to this tensor-parallel rank's piece and
converted to float32 (``BF16`` is ``uint16 << 16``) straight into the already-built
parameter's memory, so no second copy of the weights is ever held (the mapped pages of one
tensor at a time come on top).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np
import paddle

from .folder_inspection import STORED_DTYPES, TensorEntry, check_dtype_runs, inspect_folder
from .hf_config import UnsupportedModelError
from .model_config import ModelConfig
from .mtp_layer import MTPLayer, MTPStack, build_mtp
from .parallel_layers import shard_axes
from .target import TinyTargetModel
from .weight_maps import WeightRef


def build_models(
    config: ModelConfig, tensor_parallel_size: int = 1, tensor_parallel_rank: int = 0
) -> tuple[TinyTargetModel, MTPLayer | MTPStack | None]:
    """The target model and its MTP layers (``None`` without any), parameters in
    ``config.dtype``."""
    previous = paddle.get_default_dtype()
    paddle.set_default_dtype(config.dtype)
    try:
        target = TinyTargetModel(config, tensor_parallel_size, tensor_parallel_rank)
        return target, build_mtp(config, target)
    finally:
        paddle.set_default_dtype(previous)


def tensor_view(
    entry: TensorEntry, ref: WeightRef, axis: int | None, tp: int, rank: int
) -> np.ndarray:
    """A read-only memory-mapped view of ``entry`` in our layout (transposed when the
    checkpoint is ``[out, in]``), cut to this rank's slice along ``axis`` (``None`` = whole),
    in the stored dtype (raw ``uint16`` for BF16). Nothing is read until it is indexed, except
    for a tensor made of ``ref.parts``, whose rank slices are joined into one array."""
    count = int(np.prod(entry.shape))
    stored = np.memmap(
        entry.file, dtype=STORED_DTYPES[entry.dtype], mode="r", offset=entry.offset, shape=(count,)
    )
    view = stored.reshape(entry.shape)
    if ref.transpose:
        view = view.T
    if axis is None:
        return view
    bounds = np.cumsum((0, *(ref.parts or (view.shape[axis],))))
    pieces = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        size = (end - begin) // tp
        cut: list[slice] = [slice(None)] * view.ndim
        cut[axis] = slice(begin + rank * size, begin + (rank + 1) * size)
        pieces.append(view[tuple(cut)])
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=axis)


def convert_into(out: np.ndarray, view: np.ndarray, stored_dtype: str) -> None:
    """Write ``view`` (from :func:`tensor_view`) into the float32 array ``out`` of its shape:
    BF16 bits are widened (``uint16 << 16``), F16/F64 cast, F32 copied."""
    if stored_dtype == "BF16":
        np.left_shift(view, np.uint32(16), out=out.view(np.uint32), casting="safe")
    else:
        np.copyto(out, view, casting="unsafe")


def _writable_float32(param: paddle.Tensor) -> np.ndarray | None:
    """A numpy array over a CPU float32 parameter's own memory (writes land in the
    parameter), or ``None`` when the parameter is elsewhere or in another dtype."""
    if param.dtype != paddle.float32 or not param.place.is_cpu_place() or not param.is_contiguous():
        return None
    shape = [int(d) for d in param.shape]
    nbytes = int(np.prod(shape)) * 4
    raw = (ctypes.c_char * nbytes).from_address(param.data_ptr())
    return np.frombuffer(memoryview(raw), dtype=np.float32).reshape(shape)


def fill_parameter(
    param: paddle.Tensor, entry: TensorEntry, ref: WeightRef, axis: int | None, tp: int, rank: int
) -> None:
    """Copy this rank's slice of checkpoint tensor ``entry`` into ``param``: straight from the
    mapped file into the parameter's memory on the CPU (no intermediate copy), through one
    float32 temporary otherwise."""
    view = tensor_view(entry, ref, axis, tp, rank)
    target = _writable_float32(param)
    if target is not None:
        convert_into(target, view, entry.dtype)
        return
    value = np.empty(view.shape, np.float32)
    convert_into(value, view, entry.dtype)
    param.set_value(
        value if param.dtype == paddle.float32 else paddle.to_tensor(value).astype(param.dtype)
    )


def _progress(files: list[str], progress: bool | None) -> Iterable[str]:
    show = sys.stderr.isatty() if progress is None else progress
    if not show:
        return files
    from tqdm import tqdm  # type: ignore[import-untyped]

    return tqdm(files, desc="loading shards", unit="shard", file=sys.stderr)


def load_model(
    path: str | os.PathLike[str],
    *,
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
    tensor_parallel_rank: int = 0,
    progress: bool | None = None,
) -> tuple[TinyTargetModel, MTPLayer | MTPStack | None, ModelConfig]:
    """Build and load a model folder (whole, or one tensor-parallel rank's shard).

    Args:
        path: the folder (see :func:`inspect_model_folder`).
        dtype: ``"auto"`` or a dtype name; half precision is refused on the CPU.
        tensor_parallel_size, tensor_parallel_rank: load this rank's slices only.
        progress: a progress bar per shard on stderr; ``None`` = when stderr is a terminal.

    Returns:
        ``(target, mtp, config)`` in eval mode; ``mtp`` is ``None`` when the folder has no
        MTP layer (``num_nextn_predict_layers == 0``); ``config`` is the unsharded config.

    Raises:
        UnsupportedModelError: as :func:`inspect_model_folder`, before any weight is read.
        ValueError: a config field ``tensor_parallel_size`` does not divide, or a bad rank.
    """
    where = os.fspath(path)
    plan = inspect_folder(where, dtype)
    check_dtype_runs(plan.config, where)
    target, mtp = build_models(plan.config, tensor_parallel_size, tensor_parallel_rank)
    owners: dict[str, Any] = {"target": target, "mtp": mtp}
    params = {o: dict(m.named_parameters()) for o, m in owners.items() if m is not None}
    axes = {
        o: (shard_axes(m) if tensor_parallel_size > 1 else {})
        for o, m in owners.items()
        if m is not None
    }
    mapped = {(r.owner, r.ours) for r in plan.refs}
    unmapped = sorted(f"{o}.{n}" for o, ps in params.items() for n in ps if (o, n) not in mapped)
    if unmapped:
        raise UnsupportedModelError(
            f"model folder {where}: no checkpoint tensor is mapped to parameter {unmapped[0]}"
        )
    by_file: dict[str, list[WeightRef]] = {}
    for ref in plan.refs:
        by_file.setdefault(plan.tensors[ref.ckpt].file, []).append(ref)
    for file in _progress(sorted(by_file), progress):
        for ref in by_file[file]:
            param = params[ref.owner][ref.ours]
            axis = axes[ref.owner].get(ref.ours)
            fill_parameter(
                param, plan.tensors[ref.ckpt], ref, axis, tensor_parallel_size, tensor_parallel_rank
            )
    target.eval()
    if mtp is not None:
        mtp.eval()
    return target, mtp, plan.config
