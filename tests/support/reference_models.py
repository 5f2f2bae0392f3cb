"""transformers' models of a tiny test folder, loaded once per path by the package's own
reference (:class:`fastdeploy_mtp.checks.reference.Reference`, the loading ``check-drafts``
uses: float32, eager attention, MTP layers through ``MtpModel.from_pretrained`` where
transformers maps the family's names, by the released names for MiMo and dense ERNIE-4.5).
The folder writers call :func:`forget` when they (re)write a folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastdeploy_mtp.checks.reference import Reference

_LOADED: dict[str, Reference] = {}


def reference(folder: str | Path) -> Reference:
    """The cached :class:`Reference` of ``folder``."""
    key = str(Path(folder).resolve())
    if key not in _LOADED:
        _LOADED[key] = Reference(key)
    return _LOADED[key]


def models(folder: str | Path) -> tuple[Any, Any]:
    """``(target, mtp or None)`` of ``folder``."""
    ref = reference(folder)
    return ref.target, ref.mtp


def forget(folder: str | Path) -> None:
    """Drop ``folder``'s cached models (it was written anew)."""
    _LOADED.pop(str(Path(folder).resolve()), None)
