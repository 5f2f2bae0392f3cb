"""Op-test backends: run one op on numpy inputs through a given backend, return every
tensor argument after the call as numpy (so tests compare all in-place effects).

* ``cpu``          the Paddle custom op on CPU tensors (needs paddle);
* ``kernels-cpu``  the framework-free module ``fastdeploy_mtp._kernels`` on numpy arrays
                   (the DLPack path, no Paddle);
* ``cuda``         the framework-free module on CUDA tensors (torch, else CuPy); only where
                   a GPU is usable.

Each backend is the same op entry underneath, so the same references apply to all.
An optional input is passed as ``None`` and comes back as ``None``.
"""

from __future__ import annotations

import importlib
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

ALL_BACKENDS = ("cpu", "kernels-cpu", "cuda")


def _map(fn, t):
    """fn(t), except that an absent optional input (None) stays None."""
    return None if t is None else fn(t)


class Backend:
    name = ""

    def run(self, op: str, tensors: Sequence[np.ndarray], attrs: Sequence[Any] = ()) -> List[np.ndarray]:
        raise NotImplementedError


class PaddleCpuBackend(Backend):
    name = "cpu"

    def run(self, op, tensors, attrs=()):
        import paddle

        import fastdeploy_mtp.ops as ops

        pts = [_map(lambda a: paddle.to_tensor(np.array(a, copy=True), place=paddle.CPUPlace()), t) for t in tensors]
        getattr(ops, op)(*pts, *attrs)
        return [_map(lambda x: x.numpy(), t) for t in pts]


class KernelsCpuBackend(Backend):
    name = "kernels-cpu"

    def run(self, op, tensors, attrs=()):
        from fastdeploy_mtp import _kernels

        arrays = [_map(lambda a: np.array(a, copy=True), t) for t in tensors]
        getattr(_kernels, op)(*arrays, *attrs)
        return arrays


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, lib: str):
        self.lib = lib

    def run(self, op, tensors, attrs=()):
        from fastdeploy_mtp import _kernels

        if self.lib == "torch":
            import torch

            dev = [_map(lambda a: torch.from_numpy(np.array(a, copy=True)).cuda(), t) for t in tensors]
            stream = torch.cuda.current_stream().cuda_stream
            getattr(_kernels, op)(*dev, *attrs, stream=stream)
            torch.cuda.synchronize()
            return [_map(lambda x: x.cpu().numpy(), t) for t in dev]
        import cupy

        dev = [_map(lambda a: cupy.asarray(np.array(a, copy=True)), t) for t in tensors]
        stream = cupy.cuda.get_current_stream().ptr
        getattr(_kernels, op)(*dev, *attrs, stream=stream)
        cupy.cuda.get_current_stream().synchronize()
        return [_map(cupy.asnumpy, t) for t in dev]


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


def availability(name: str) -> Tuple[Optional[Backend], str]:
    """(backend, "") if usable here, else (None, the reason it is not)."""
    try:
        from fastdeploy_mtp import _kernels
    except ImportError as e:
        return None, f"fastdeploy_mtp._kernels is not built ({e})"
    if name == "cpu":
        if not _importable("paddle"):
            return None, "paddle is not installed (the Paddle op binding needs it)"
        return PaddleCpuBackend(), ""
    if name == "kernels-cpu":
        return KernelsCpuBackend(), ""
    if name == "cuda":
        if not _kernels.build_info()["cuda"]:
            return None, "fastdeploy_mtp was built without CUDA kernels"
        usable, reason = _kernels.cuda_status()
        if not usable:
            return None, f"CUDA is not usable here: {reason}"
        for lib in ("torch", "cupy"):
            if _importable(lib):
                return CudaBackend(lib), ""
        return None, "neither torch nor cupy is installed to hold CUDA buffers"
    raise ValueError(f"unknown backend {name!r}; known: {ALL_BACKENDS}")
