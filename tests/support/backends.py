"""Op-test backends: run one op on numpy inputs through a given backend, return every
tensor argument after the call as numpy (so tests compare all in-place effects).

* ``cpu``          the Paddle custom op on CPU tensors (needs paddle);
* ``kernels-cpu``  the framework-free module ``fastdeploy_mtp._kernels`` on numpy arrays
                   (the DLPack path, no Paddle);
* ``cuda``         the framework-free module on CUDA tensors (torch, else CuPy); only where
                   a GPU is usable.
* ``cuda-emu``     the framework-free module on numpy arrays inside ``_kernels.cuda_emulation``:
                   the CUDA kernels (``custom_ops/gpu/*.cu``) under the CUDA emulator, with its
                   race, barrier, warp-mask and bounds checks. Every call runs twice, with the
                   launch shapes the launchers ask for and with small blocks and grids
                   (``CUDA_EMU_SHAPES``); the results must be bit-identical.
* ``xpu-emu``      the framework-free module on numpy arrays inside ``_kernels.xpu_emulation``:
                   the XPU3 kernels (``custom_ops/xpu/kernel/*.xpu``) under the KP emulator.
                   Every call runs twice, launched with two different (clusters, cores)
                   shapes (``XPU_EMU_LAUNCHES``); the second must give bit-identical tensors,
                   and the first is returned (and compared with the reference by the test).

Each backend is the same op entry underneath, so the same references apply to all.

Two conventions, shared by every op test:

* **bfloat16** (numpy has none) is carried as ``uint16`` bit patterns; every backend hands a
  ``uint16`` array to the op as a bfloat16 tensor (Paddle does this itself; the kernels
  backends pass a raw-pointer tuple or a torch bfloat16 view) and returns bf16 results as
  ``uint16`` again. No op takes real uint16 tensors.
* **Outputs the op allocates** (Paddle ops that return new tensors): pass
  ``outputs=[(name, shape, dtype), ...]`` in the op's output order. The Paddle backend
  checks that the op returns tensors of exactly those shapes and dtypes (its InferShape /
  InferDtype); the framework-free backends allocate them, pre-filled with a 0xA5 byte
  pattern so an element the op forgets to write shows up, and pass them as keyword
  arguments ``name=buffer``. ``run`` returns the argument tensors followed by the outputs.
* **Optional inputs** are passed as ``None`` and come back as ``None``.
* Every backend calls the op by keyword (:func:`call_kwargs`): ``tensors`` in the op's
  declared input order, ``attrs`` in its declared attr order.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np

OutputSpec = tuple[str, tuple[int, ...], Any]  # (name, shape, numpy dtype)

ALL_BACKENDS = ("cpu", "kernels-cpu", "cuda", "cuda-emu", "xpu-emu")
# The backends a plain `pytest` run uses. cuda-emu has its own CI line,
# `FDMTP_TEST_BACKENDS=cuda-emu python -m pytest tests/ops`, where an unavailable backend fails
# instead of skipping (it costs about as much as all the others together).
DEFAULT_BACKENDS = ("cpu", "kernels-cpu", "cuda", "xpu-emu")

# Launch shapes of the xpu-emu backend: several clusters of a few cores, and an odd shape
# whose core count does not divide typical batch sizes (indexing mistakes show as diffs).
XPU_EMU_LAUNCHES = ((3, 16), (2, 7))
# Launch shapes of the cuda-emu backend: 0 = as the launchers ask, 1 = blocks of at most 64
# threads and grids of at most 3 blocks (grid-stride and chunk loops wrap).
CUDA_EMU_SHAPES = (0, 1)


def call_kwargs(op: str, tensors: Sequence[Any], attrs: Sequence[Any]) -> dict[str, Any]:
    """The op's arguments by name: `tensors` in the op's declared input order, `attrs` in its
    declared attr order (trailing attrs may be left to their defaults). Calls by keyword work
    the same for every binding, whatever order a wrapper's positional form uses."""
    from fastdeploy_mtp.ops import OP_SIGNATURES

    inputs, attr_names = OP_SIGNATURES[op]
    assert len(tensors) == len(inputs), f"{op} takes {len(inputs)} tensors, got {len(tensors)}"
    assert len(attrs) <= len(attr_names), f"{op} takes {len(attr_names)} attrs, got {len(attrs)}"
    return {**dict(zip(inputs, tensors)), **dict(zip(attr_names, attrs))}


@contextlib.contextmanager
def _recording(received):
    """On an error from the op, attach ``received()`` to the exception as ``.received``: the
    argument buffers *the op was given* (each backend passes copies of the caller's arrays),
    read back after the failed call, so a test can check that a rejected call wrote nothing."""
    try:
        yield
    except Exception as e:
        e.received = received()
        raise


def _map(fn, t):
    """fn(t), except that an absent optional input (None) stays None."""
    return None if t is None else fn(t)


def _garbage(spec: OutputSpec) -> np.ndarray:
    _, shape, dtype = spec
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return np.full(nbytes, 0xA5, np.uint8).view(dtype).reshape(shape)


def _raw_bf16(a: np.ndarray, device: str):
    """A raw-pointer tuple that presents a numpy uint16 array's bits as a bfloat16 tensor."""
    return (a.ctypes.data, "bfloat16", tuple(a.shape), device)


class Backend:
    name = ""

    def run(
        self,
        op: str,
        tensors: Sequence[np.ndarray],
        attrs: Sequence[Any] = (),
        outputs: Sequence[OutputSpec] = (),
    ) -> list[np.ndarray]:
        raise NotImplementedError


class PaddleCpuBackend(Backend):
    name = "cpu"

    def run(self, op, tensors, attrs=(), outputs=()):
        import paddle

        import fastdeploy_mtp.ops as ops

        # paddle.to_tensor maps uint16 to bfloat16, and .numpy() maps it back
        pts = [
            _map(lambda a: paddle.to_tensor(np.array(a, copy=True), place=paddle.CPUPlace()), t)
            for t in tensors
        ]
        with _recording(lambda: [_map(lambda x: x.numpy(), t) for t in pts]):
            result = getattr(ops, op)(**call_kwargs(op, pts, attrs))
        if not outputs:
            return [_map(lambda x: x.numpy(), t) for t in pts]
        result = list(result) if isinstance(result, (list, tuple)) else [result]
        assert len(result) == len(outputs), (
            f"{op} returned {len(result)} outputs, expected {len(outputs)}"
        )
        got = [r.numpy() for r in result]
        for (name, shape, dtype), g in zip(outputs, got):
            assert g.shape == tuple(shape) and g.dtype == np.dtype(dtype), (
                f"{op}: output `{name}` is {g.dtype}{list(g.shape)}, expected "
                f"{np.dtype(dtype)}{list(shape)}"
            )
        return [_map(lambda x: x.numpy(), t) for t in pts] + got


class KernelsCpuBackend(Backend):
    name = "kernels-cpu"

    def run(self, op, tensors, attrs=(), outputs=()):
        from fastdeploy_mtp import _kernels

        arrays = [_map(lambda a: np.array(a, copy=True), t) for t in tensors]
        outs = [_garbage(spec) for spec in outputs]

        def arg(a):
            return _raw_bf16(a, "cpu") if a is not None and a.dtype == np.uint16 else a

        with _recording(lambda: [_map(lambda a: np.array(a, copy=True), t) for t in arrays]):
            getattr(_kernels, op)(
                **call_kwargs(op, [arg(a) for a in arrays], attrs),
                **{s[0]: arg(o) for s, o in zip(outputs, outs)},
            )
        return arrays + outs


class _EmulatedBackend(Backend):
    """The framework-free module on numpy arrays, once inside each emulation scope of
    ``scopes()``: the first call's tensors are returned, every other call's must be
    bit-identical to them."""

    def scopes(self) -> list[tuple[str, Any]]:
        raise NotImplementedError

    def run(self, op, tensors, attrs=(), outputs=()):
        results = []
        scopes = self.scopes()
        for _, scope in scopes:
            with scope:
                results.append(KernelsCpuBackend().run(op, tensors, attrs, outputs))
        first, *others = results
        for (label, _), other in zip(scopes[1:], others):
            for i, (a, b) in enumerate(zip(first, other)):
                if a is None:
                    continue
                assert (
                    a.dtype == b.dtype
                    and a.shape == b.shape
                    and np.array_equal(a.view(np.uint8), b.view(np.uint8))
                ), f"{op}: tensor #{i} differs between launches {scopes[0][0]} and {label}"
        # in-place effects on the caller's arrays are not observed: tests use the returned copies
        return first


class XpuEmuBackend(_EmulatedBackend):
    name = "xpu-emu"

    def scopes(self):
        from fastdeploy_mtp import _kernels

        return [(f"<<<{c}, {k}>>>", _kernels.xpu_emulation(c, k)) for c, k in XPU_EMU_LAUNCHES]


class CudaEmuBackend(_EmulatedBackend):
    name = "cuda-emu"

    def scopes(self):
        from fastdeploy_mtp import _kernels

        return [(f"shape {s}", _kernels.cuda_emulation(s)) for s in CUDA_EMU_SHAPES]


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, lib: str):
        self.lib = lib

    def run(self, op, tensors, attrs=(), outputs=()):
        from fastdeploy_mtp import _kernels

        host = [_map(lambda a: np.array(a, copy=True), t) for t in tensors] + [
            _garbage(spec) for spec in outputs
        ]
        names = [spec[0] for spec in outputs]
        n_in = len(tensors)
        if self.lib == "torch":
            import torch

            def to_dev(a):
                if a is None:
                    return None
                if a.dtype == np.uint16:  # bfloat16 bits
                    return torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
                return torch.from_numpy(a).cuda()

            def to_host(t, like):
                if t is None:
                    return None
                if like.dtype == np.uint16:
                    return t.view(torch.int16).cpu().numpy().view(np.uint16)
                return t.cpu().numpy()

            dev = [to_dev(a) for a in host]
            stream = torch.cuda.current_stream().cuda_stream
            with _recording(lambda: [to_host(t, a) for t, a in zip(dev[:n_in], host)]):
                kwargs = call_kwargs(op, dev[:n_in], attrs)
                getattr(_kernels, op)(**kwargs, **dict(zip(names, dev[n_in:])), stream=stream)
            torch.cuda.synchronize()
            return [to_host(t, a) for t, a in zip(dev, host)]
        import cupy

        dev = [_map(cupy.asarray, a) for a in host]
        device = f"cuda:{cupy.cuda.Device().id}"
        args = [
            (d.data.ptr, "bfloat16", tuple(d.shape), device)
            if d is not None and d.dtype == np.uint16
            else d
            for d in dev
        ]
        stream = cupy.cuda.get_current_stream().ptr
        with _recording(lambda: [_map(cupy.asnumpy, d) for d in dev[:n_in]]):
            getattr(_kernels, op)(
                **call_kwargs(op, args[:n_in], attrs),
                **dict(zip(names, args[n_in:])),
                stream=stream,
            )
        cupy.cuda.get_current_stream().synchronize()
        return [_map(cupy.asnumpy, d) for d in dev]


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


def required_backends() -> list[str]:
    """The backends named in FDMTP_TEST_BACKENDS (comma-separated; empty: none required)."""
    import os

    return [b for b in os.environ.get("FDMTP_TEST_BACKENDS", "").split(",") if b]


def usable_or_skip(name: str, impl: Any, reason: str) -> Any:
    """``impl``, the backend ``name`` as a fixture gets it: when it is unavailable
    (``impl`` None), the test fails if FDMTP_TEST_BACKENDS requires ``name`` and is skipped
    with ``reason`` otherwise (so a GPU check cannot pass by skipping)."""
    import pytest

    if impl is None:
        if required_backends():
            pytest.fail(f"backend {name} was required but is unavailable: {reason}")
        pytest.skip(f"backend {name}: {reason}")
    return impl


def availability(name: str) -> tuple[Backend | None, str]:
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
    if name == "cuda-emu":
        return CudaEmuBackend(), ""
    if name == "xpu-emu":
        if not _kernels.build_info().get("xpu_emulator", False):
            return None, "this build has the real XPU toolchain, not the emulator"
        return XpuEmuBackend(), ""
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
