"""Checkpoint tensors by name, read lazily: :class:`TensorSource` over a dict of arrays, a
``.safetensors`` file or a folder of shards, and the errors a checkpoint load raises (each
naming the checkpoint tensor). Framework-free: numpy arrays out, Paddle never imported."""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping

import numpy as np

#: What :class:`TensorSource` opens: a dict of arrays, a ``.safetensors`` file or a directory.
CheckpointSource = str | os.PathLike[str] | Mapping[str, np.ndarray]


class CheckpointError(ValueError):
    """Base class of checkpoint loading errors; the message names the checkpoint tensor."""


class MissingTensorError(CheckpointError):
    """A tensor the model needs is not in the checkpoint."""


class TensorShapeError(CheckpointError):
    """A checkpoint tensor has the wrong shape (the message gives expected vs got)."""


class UnsupportedTensorError(CheckpointError):
    """The checkpoint has a tensor under the MTP prefix that this model cannot use
    (MoE experts, MLA, q/k norms, a second MTP layer, ...)."""


class TensorSource:
    """Read-only name -> numpy array view of a checkpoint.

    Args:
        source: a ``dict`` of numpy arrays, a ``.safetensors`` file, or a directory whose
            ``*.safetensors`` files (shards) are read together. Files are opened lazily with
            ``safetensors.safe_open`` so only the tensors that are asked for are read.
    """

    def __init__(self, source: CheckpointSource):
        self._arrays: Mapping[str, np.ndarray] | None = None
        self._where: dict[str, str] = {}
        if isinstance(source, Mapping):
            self._arrays = source
            self.description = "<dict>"
            return
        path = os.fspath(source)
        if os.path.isdir(path):
            files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
            if not files:
                raise FileNotFoundError(f"no *.safetensors files in checkpoint directory {path!r}")
        elif os.path.isfile(path):
            files = [path]
        else:
            raise FileNotFoundError(f"checkpoint path {path!r} does not exist")
        from safetensors import safe_open

        for f in files:
            with safe_open(f, framework="numpy") as handle:
                for key in handle.keys():
                    self._where[key] = f
        self.description = path

    def keys(self) -> list[str]:
        return sorted(self._arrays.keys() if self._arrays is not None else self._where.keys())

    def __contains__(self, name: str) -> bool:
        return name in (self._arrays if self._arrays is not None else self._where)

    def get(self, name: str) -> np.ndarray:
        if name not in self:
            raise MissingTensorError(f"checkpoint {self.description} has no tensor {name!r}")
        if self._arrays is not None:
            return np.asarray(self._arrays[name])
        from safetensors import safe_open

        with safe_open(self._where[name], framework="numpy") as handle:
            return handle.get_tensor(name)
