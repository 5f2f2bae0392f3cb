"""Runs fuzz cases for tests/fuzz/test_fuzz_ops.py in a child process.

Reads pickled cases from stdin, one per line-framed message; for each, builds the
arguments, calls the op through one binding, and writes back a pickled verdict. A crash
(signal) or a hang kills only this process: the parent sees it, records the case that
caused it, and starts a new worker.

A case is ``(op, backend, tensors, attrs, outputs)``: ``tensors`` maps each input name to a
numpy array (or None), possibly a non-contiguous view (sent as ``(EVERY_OTHER_ROW, base)``:
pickle would send a contiguous copy); ``outputs`` maps each caller-provided output
(``_kernels`` only) to an array. The verdict is ``("error", message, changed)`` (the op
refused the call; ``changed`` names every argument buffer whose bytes changed) or
``("ok", results)`` with every tensor and output after the call, by name (the Paddle op's
allocated outputs under their declared names), or
``("exception", type name, message)`` for anything that is not a ``ValueError``.
"""

from __future__ import annotations

import pickle
import struct
import sys
import traceback
from typing import Any

import numpy as np

# A strided view sent as (EVERY_OTHER_ROW, base) stands for base[::2] (pickle would send a
# contiguous copy of the view).
EVERY_OTHER_ROW = "every-other-row"


def _decode_views(arrays: dict) -> dict:
    return {
        k: v[1][::2] if isinstance(v, tuple) and v[0] == EVERY_OTHER_ROW else v
        for k, v in arrays.items()
    }


def _bytes(a: np.ndarray | None) -> bytes | None:
    return None if a is None else np.ascontiguousarray(a).tobytes()


def _run_kernels(op: str, tensors: dict, attrs: dict, outputs: dict, emulate: str) -> Any:
    """The framework-free op; ``emulate`` is "", "xpu" (XPU3 kernels under the KP emulator)
    or "cuda" (the CUDA kernels under the CUDA emulator, small launch shape)."""
    from fastdeploy_mtp import _kernels

    def arg(a):
        if a is not None and a.dtype == np.uint16:  # bfloat16 bits
            return (a.ctypes.data, "bfloat16", tuple(a.shape), "cpu") if a.flags.c_contiguous else a
        return a

    kwargs = {k: arg(v) for k, v in tensors.items()}
    kwargs.update(attrs)
    kwargs.update({k: arg(v) for k, v in outputs.items()})
    fn = getattr(_kernels, op)
    if emulate == "xpu":
        with _kernels.xpu_emulation(2, 7):
            fn(**kwargs)
    elif emulate == "cuda":
        with _kernels.cuda_emulation(1):
            fn(**kwargs)
    else:
        fn(**kwargs)


def _run_paddle(op: str, tensors: dict, attrs: dict) -> tuple[dict, list]:
    import paddle

    import fastdeploy_mtp.ops as ops

    def to_paddle(a):
        if a is None:
            return None
        if not a.flags.c_contiguous and a.base is not None and a.base.shape[0] == 2 * a.shape[0]:
            # the fuzzer's strided views are base[::2]: the same view of a Paddle tensor
            return paddle.to_tensor(a.base, place=paddle.CPUPlace())[::2]
        return paddle.to_tensor(np.array(a, copy=True, order="C"), place=paddle.CPUPlace())

    pts = {k: to_paddle(v) for k, v in tensors.items()}
    before = {k: _bytes(v) for k, v in tensors.items()}
    try:
        result = getattr(ops, op)(**pts, **attrs)
    except Exception:
        after = {k: (None if v is None else _bytes(v.numpy())) for k, v in pts.items()}
        changed = [k for k in pts if after[k] != before[k]]
        raise _Failed(changed) from None
    outs = [] if result is None else list(result) if isinstance(result, tuple | list) else [result]
    return {k: (None if v is None else v.numpy()) for k, v in pts.items()}, [
        o.numpy() for o in outs
    ]


class _Failed(Exception):
    def __init__(self, changed: list[str]):
        super().__init__("")
        self.changed = changed


def run_case(case: tuple) -> tuple:
    op, backend, tensors, attrs, outputs = case
    tensors, outputs = _decode_views(tensors), _decode_views(outputs)
    before = {k: _bytes(v) for k, v in {**tensors, **outputs}.items()}
    try:
        if backend == "cpu":
            try:
                got, outs = _run_paddle(op, tensors, attrs)
            except _Failed as failed:
                cause = failed.__context__
                assert cause is not None
                if not isinstance(cause, ValueError):
                    return ("exception", type(cause).__name__, str(cause))
                return ("error", str(cause), failed.changed)
            from tests.support.op_declarations import DECLARED

            # the allocated outputs, in declaration order, by name (as _kernels takes them)
            names = [o["name"] for o in DECLARED[op].get("outputs", [])]
            assert len(outs) == len(names), (
                f"{op} returned {len(outs)} outputs, declares {len(names)}"
            )
            return ("ok", {**got, **dict(zip(names, outs))})
        emulate = backend.removesuffix("-emu") if backend.endswith("-emu") else ""
        _run_kernels(op, tensors, attrs, outputs, emulate=emulate)
    except ValueError as e:
        changed = [k for k, v in {**tensors, **outputs}.items() if _bytes(v) != before[k]]
        return ("error", str(e), changed)
    except Exception as e:  # noqa: BLE001 - any other type is a finding, reported as such
        return ("exception", type(e).__name__, f"{e}\n{traceback.format_exc()}")
    return ("ok", {**tensors, **outputs})


def main() -> None:
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    while True:
        header = stdin.read(8)
        if len(header) < 8:
            return
        (size,) = struct.unpack("<Q", header)
        case = pickle.loads(stdin.read(size))
        verdict = pickle.dumps(run_case(case))
        stdout.write(struct.pack("<Q", len(verdict)) + verdict)
        stdout.flush()


if __name__ == "__main__":
    main()
