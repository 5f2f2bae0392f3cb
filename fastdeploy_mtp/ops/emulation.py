"""Accelerator kernels on the CPU: ``emulate("cuda")`` and ``emulate("xpu")``.

Inside ``with fastdeploy_mtp.ops.emulate("cuda"):`` every op called on this thread with CPU
tensors (Paddle CPU tensors through :mod:`fastdeploy_mtp.ops`, numpy arrays through
``fastdeploy_mtp._kernels``) runs its CUDA kernels (``custom_ops/gpu/*.cu``) under the CUDA
emulator instead of the CPU kernels; ``emulate("xpu")`` runs the XPU3 kernels under the KP
emulator. The emulators fail the op (:class:`OpError` from the Paddle ops, ``KernelError``
from ``_kernels``) where the hardware would misbehave: a shared-memory race, a barrier some
threads never reach, a warp intrinsic with a wrong mask, an access outside the op's tensors,
an invalid launch shape (CUDA); local-memory overflow, a barrier mismatch, an invalid launch
shape (XPU). ``docs/architecture.md`` says what each emulator checks and what it cannot.

Example::

    import paddle, fastdeploy_mtp.ops as ops

    with ops.emulate("cuda"):  # the CUDA kernels, on the CPU
        ops.draft_model_postprocess(draft, seq_lens_this_time, seq_lens_encoder, stop_flags)
    with ops.emulate("cuda", shape=1):  # the same, launched with small blocks and grids
        ...
    with ops.emulate("xpu", clusters=2, cores=7):
        ...

Scopes are per thread and nest (the innermost wins); one emulator at a time per call.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
from collections.abc import Iterator

from ._loader import _LIBRARY, _load_paddle_api, kernels

_KINDS = ("cuda", "xpu")


def _paddle_library() -> ctypes.CDLL | None:
    """The loaded Paddle ops library, or None where Paddle is not installed or the library
    was not built (``-DFDMTP_WITH_PADDLE=OFF``: the framework-free module only)."""
    if importlib.util.find_spec("paddle") is None or not os.path.exists(_LIBRARY):
        return None
    _load_paddle_api()  # loads it into Paddle first (ctypes then gets the same handle)
    return ctypes.CDLL(_LIBRARY)


@contextlib.contextmanager
def emulate(kind: str, *, shape: int = 0, clusters: int = 2, cores: int = 7) -> Iterator[None]:
    """Runs the ops called on this thread on CPU tensors through an accelerator's kernels
    under its emulator, for the duration of the ``with`` block.

    Args:
        kind: ``"cuda"`` (the CUDA kernels under the CUDA emulator) or ``"xpu"`` (the XPU3
            kernels under the KP emulator).
        shape: CUDA only. 0 launches every kernel as its launcher asks; 1 shrinks blocks to
            at most 64 threads and grids to at most 3 blocks (results must not change).
        clusters, cores: XPU only. The launch shape ``<<<clusters, cores>>>`` (cores <= 64).

    Raises:
        ValueError: an unknown ``kind`` or ``shape``, or a non-positive ``clusters``/``cores``.
    """
    if kind not in _KINDS:
        raise ValueError(f"emulate: kind must be one of {_KINDS}, got {kind!r}")
    if kind == "cuda" and shape not in (0, 1):
        raise ValueError(
            f"emulate: shape must be 0 (as launched) or 1 (small blocks), got {shape!r}"
        )
    if kind == "xpu" and (clusters < 1 or cores < 1):
        raise ValueError(
            f"emulate: clusters and cores must be >= 1, got clusters={clusters} cores={cores}"
        )
    k = kernels()
    scope = k.cuda_emulation(shape) if kind == "cuda" else k.xpu_emulation(clusters, cores)
    lib = _paddle_library()
    with scope:
        if lib is not None:
            pushed = (
                lib.fdmtp_emulation_push_cuda(shape)
                if kind == "cuda"
                else lib.fdmtp_emulation_push_xpu(clusters, cores)
            )
            if pushed != 0:  # pragma: no cover - the arguments were checked above
                raise ValueError(f"emulate: the Paddle ops library refused {kind!r}")
        try:
            yield
        finally:
            if lib is not None:
                lib.fdmtp_emulation_pop()
