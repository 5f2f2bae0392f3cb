"""Op-test backends: run one op on numpy inputs through a given backend, return every
tensor argument after the call as numpy (so tests compare all in-place effects).

* ``cpu``          the Paddle custom op on CPU tensors (needs paddle);
* ``kernels-cpu``  the framework-free module ``fastdeploy_mtp._kernels`` on numpy arrays
                   (the DLPack path, no Paddle);
* ``cuda``         the framework-free module on CUDA tensors (torch, else CuPy); only where
                   a GPU is usable.

Each backend is the same op entry underneath, so the same references apply to all.

Ops that allocate outputs: pass ``outputs`` = [(shape, dtype), ...]. The Paddle op allocates
and returns them; the framework-free module takes them as caller-allocated buffers after the
input tensors (pre-filled here with garbage, so a slot the op fails to write shows up).
``run`` returns the input tensors after the call followed by the outputs.

An optional input is passed as ``None`` and comes back as ``None``.

The Paddle backend calls the registered op in its raw form (inputs, then attrs), which is
the form the framework-free module also has; each op's typed wrapper is tested on its own.
"""

from __future__ import annotations

import importlib
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

ALL_BACKENDS = ("cpu", "kernels-cpu", "cuda")


OutputSpec = Tuple[Tuple[int, ...], Any]  # (shape, numpy dtype)


def _map(fn, t):
    """fn(t), except that an absent optional input (None) stays None."""
    return None if t is None else fn(t)


def garbage(shape, dtype) -> np.ndarray:
    """An output buffer full of a value no op writes on purpose."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        fill = True
    elif dtype.kind == "u":
        fill = np.iinfo(dtype).max
    elif dtype.kind == "i":
        fill = -7777
    else:
        fill = np.nan
    return np.full(shape, fill, dtype=dtype)


class Backend:
    name = ""

    def run(
        self,
        op: str,
        tensors: Sequence[np.ndarray],
        attrs: Sequence[Any] = (),
        outputs: Sequence[OutputSpec] = (),
    ) -> List[np.ndarray]:
        raise NotImplementedError


class PaddleCpuBackend(Backend):
    name = "cpu"

    def run(self, op, tensors, attrs=(), outputs=()):
        import paddle

        from fastdeploy_mtp.ops._loader import run_paddle_op

        pts = [_map(lambda a: paddle.to_tensor(np.array(a, copy=True), place=paddle.CPUPlace()), t) for t in tensors]
        result = run_paddle_op(op, *pts, *attrs)
        outs = []
        if outputs:
            result = result if isinstance(result, (list, tuple)) else [result]
            assert len(result) == len(outputs), f"{op} returned {len(result)} outputs"
            outs = [r.numpy() for r in result]
        return [_map(lambda x: x.numpy(), t) for t in pts] + outs


class KernelsCpuBackend(Backend):
    name = "kernels-cpu"

    def run(self, op, tensors, attrs=(), outputs=()):
        from fastdeploy_mtp import _kernels

        arrays = [_map(lambda a: np.array(a, copy=True), t) for t in tensors]
        outs = [garbage(shape, dtype) for shape, dtype in outputs]
        getattr(_kernels, op)(*arrays, *outs, *attrs)
        return arrays + outs


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, lib: str):
        self.lib = lib

    def run(self, op, tensors, attrs=(), outputs=()):
        from fastdeploy_mtp import _kernels

        host = [_map(lambda a: np.array(a, copy=True), t) for t in tensors]
        host += [garbage(s, d) for s, d in outputs]
        if self.lib == "torch":
            import torch

            dev = [_map(lambda a: torch.from_numpy(a).cuda(), t) for t in host]
            stream = torch.cuda.current_stream().cuda_stream
            getattr(_kernels, op)(*dev, *attrs, stream=stream)
            torch.cuda.synchronize()
            return [_map(lambda x: x.cpu().numpy(), t) for t in dev]
        import cupy

        dev = [_map(cupy.asarray, t) for t in host]
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
