"""Loading of the native libraries, exactly once per process.

Two native modules are built from ``custom_ops/``:

* ``fastdeploy_mtp/ops/_fdmtp_ops<EXT_SUFFIX>`` — the Paddle custom ops. Registering the same op
  names twice in one process aborts the interpreter (SIGABRT inside Paddle), so the
  library is registered at most once: the generated op API is kept in ``sys.modules``
  (surviving ``importlib.reload``), and if another library already registered one of our
  op names we raise instead of letting Paddle abort.
* ``fastdeploy_mtp._kernels`` — the framework-free pybind11 module (DLPack or raw
  pointers in), which also reports what the build contains.
"""

from __future__ import annotations

import importlib
import numbers
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable
from typing import Any

import numpy as np

_LIBRARY = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "_fdmtp_ops" + sysconfig.get_config_var("EXT_SUFFIX"),
)
_API_MODULE = "fastdeploy_mtp.ops._paddle_api"  # the generated op functions live here
_LOCK = threading.Lock()


class OpError(ValueError):
    """An op rejected its arguments (or a backend failed); the message names the op and
    the argument. Nothing was written."""


def kernels() -> types.ModuleType:
    """The framework-free module ``fastdeploy_mtp._kernels``."""
    try:
        return importlib.import_module("fastdeploy_mtp._kernels")
    except ImportError as e:  # pragma: no cover - only on a broken install
        raise ImportError(
            f"fastdeploy_mtp._kernels is not built: run `pip install -e .` in the repository ({e})"
        ) from e


def build_info() -> dict[str, Any]:
    """What the build holds: ``{'cuda': bool, 'xpu': bool, 'cuda_archs': str}``."""
    return dict(kernels().build_info())


def backends() -> dict[str, bool]:
    """Which backends are compiled in: ``{'cpu': True, 'cuda': bool, 'xpu': bool}``.

    ``cuda`` is True when the CUDA kernels were compiled in (nvcc was found at build
    time), whether or not a GPU is usable here; see :func:`cuda_status` for that.
    """
    info = build_info()
    return {"cpu": True, "cuda": bool(info["cuda"]), "xpu": bool(info["xpu"])}


def cuda_status() -> tuple[bool, str]:
    """``(usable, reason)``: whether CUDA kernels can be launched in this process."""
    usable, reason = kernels().cuda_status()
    return bool(usable), str(reason)


def _op_names() -> tuple[str, ...]:
    """Every op the Paddle library registers (generated from the op declarations); used to
    detect a clash with another copy."""
    from ._op_wrappers import OP_NAMES

    return tuple(OP_NAMES)


def __getattr__(name: str) -> Any:
    if name == "OP_NAMES":  # kept importable from here (it lives in the generated module)
        return _op_names()
    raise AttributeError(name)


def _load_paddle_api() -> types.ModuleType:
    OP_NAMES = _op_names()
    with _LOCK:
        api = sys.modules.get(_API_MODULE)
        if api is not None:
            return api
        if not os.path.exists(_LIBRARY):
            raise ImportError(
                f"the Paddle ops library {_LIBRARY} is missing: build it with `pip install -e .` "
                "in the repository"
            )
        import paddle  # noqa: F401  (loads libpaddle.so, which the library links by soname)
        from paddle.base import core
        from paddle.utils.cpp_extension import extension_utils

        clash = sorted(set(OP_NAMES) & set(core.get_all_op_names()))
        if clash:
            raise RuntimeError(
                f"ops {clash} are already registered in this process by another library "
                f"(another copy of fastdeploy_mtp, or FastDeploy's own ops); loading {_LIBRARY} "
                "as well would abort the interpreter"
            )
        names = extension_utils.load_op_meta_info_and_register_op(_LIBRARY)
        missing = sorted(set(OP_NAMES) - set(names))
        if missing:
            raise ImportError(f"{_LIBRARY} does not register {missing}: rebuild the package")
        api = types.ModuleType(_API_MODULE)
        source = "\n\n".join(extension_utils._custom_api_content(n) for n in names)
        exec(compile(source, f"<{_API_MODULE}>", "exec"), api.__dict__)
        sys.modules[_API_MODULE] = api
        return api


def paddle_op(name: str) -> Callable[..., Any]:
    """The generated Paddle function of op ``name`` (loads the library on first use)."""
    return getattr(_load_paddle_api(), name)


def tensor_arg(
    op: str, name: str, value: Any, *, writes: bool = False, optional: bool = False
) -> Any:
    """Checks a tensor argument before it reaches Paddle (the generated wrappers call this).

    Paddle hands a custom op a contiguous *copy* of a strided view, so the op's in-place
    writes to a view like ``big[::2]`` would be lost without an error; such views are refused
    here for every tensor the op writes. Non-tensors and uninitialised tensors are refused
    with a message naming the op and the argument.
    """
    if value is None:
        if optional:
            return None
        raise OpError(f"{op}: `{name}` is required, got None")
    import paddle

    if not isinstance(value, paddle.Tensor):
        raise OpError(f"{op}: `{name}` must be a paddle.Tensor, got {type(value).__name__}")
    # `_is_initialized` first: `Tensor.size` costs ~10 us (a numpy product of the shape), and
    # the wrappers check every tensor argument of every op call
    if not value._is_initialized() and value._numel() != 0:
        raise OpError(f"{op}: `{name}` is not initialized (no memory allocated)")
    if writes and not value.is_contiguous():
        raise OpError(
            f"{op}: `{name}` is written in place and must be contiguous, got a strided view of "
            f"shape {list(value.shape)} (Paddle would pass the op a copy and its writes would be "
            "lost); "
            "pass a contiguous tensor, e.g. `x.contiguous()`, and copy it back"
        )
    return value


def int_attr(op: str, name: str, value: Any, bits: int) -> int:
    """An integer attr that fits in ``bits`` signed bits (Paddle's ``int`` attrs are int32)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OpError(
            f"{op}: attr `{name}` must be an integer, got {type(value).__name__} {value!r}"
        )
    result = int(value)
    if not -(1 << (bits - 1)) <= result < (1 << (bits - 1)):
        raise OpError(f"{op}: attr `{name}` = {result} does not fit in int{bits}")
    return result


def bool_attr(op: str, name: str, value: Any) -> bool:
    """A bool attr: a Python or numpy bool, or the integers 0 and 1."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
        return bool(value)
    raise OpError(f"{op}: attr `{name}` must be a bool, got {value!r}")


def run_paddle_op(name: str, *args: Any) -> Any:
    """Calls op ``name``; Paddle's error for a rejected argument becomes :class:`OpError`."""
    try:
        return paddle_op(name)(*args)
    except OSError as e:  # Paddle reports custom-op exceptions as OSError
        message = str(e)
        if message.startswith(name + ":"):
            raise OpError(message.split("\n  [", 1)[0]) from None
        raise
