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
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable
from typing import Any

_LIBRARY = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "_fdmtp_ops" + sysconfig.get_config_var("EXT_SUFFIX")
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
                f"the Paddle ops library {_LIBRARY} is missing: build it with `pip install -e .` in the repository"
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


def run_paddle_op(name: str, *args: Any) -> Any:
    """Calls op ``name``; Paddle's error for a rejected argument becomes :class:`OpError`."""
    try:
        return paddle_op(name)(*args)
    except OSError as e:  # Paddle reports custom-op exceptions as OSError
        message = str(e)
        if message.startswith(name + ":"):
            raise OpError(message.split("\n  [", 1)[0]) from None
        raise
