"""A model folder's ``generation_config.json``: the sampling defaults its authors chose and
the ids that end a generation. The server uses them the way vLLM's
``--generation-config auto`` does: as the values of the fields a request leaves out (an
explicit value in the request wins)."""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from typing import Any

from ..config.validators import integer, number

GENERATION_CONFIG_FILE = "generation_config.json"

#: ``generation_config.json`` keys read as sampling defaults, with their types.
_FLOAT_KEYS = ("temperature", "top_p", "min_p", "repetition_penalty")
_INT_KEYS = ("top_k", "max_new_tokens")


@dataclasses.dataclass(frozen=True)
class GenerationDefaults:
    """Defaults for a request's sampling fields (``None``: the file does not set it).

    Attributes:
        eos_token_ids: ids that end a generation (``eos_token_id``, an int or a list).
        temperature, top_p, top_k, min_p, repetition_penalty: sampling defaults.
        max_new_tokens: the default ``max_tokens``.
    """

    eos_token_ids: list[int] = dataclasses.field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None

    def sampling_overrides(self) -> dict[str, Any]:
        """The sampling defaults the file sets, ``{field: value}`` (``max_new_tokens`` and
        the EOS ids are not sampling fields and are left out)."""
        names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


def _number(value: Any, key: str, path: str, integral: bool) -> float | int | None:
    if value is None:
        return None
    return (integer if integral else number)(value, f"{path}: `{key}`")


def _eos_ids(value: Any, path: str) -> list[int]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not all(
        isinstance(t, numbers.Integral) and not isinstance(t, bool) and int(t) >= 0 for t in items
    ):
        raise ValueError(
            f"{path}: `eos_token_id` must be a token id or a list of them, got {value!r}"
        )
    return [int(t) for t in items]


def load_generation_config(model_dir: str) -> GenerationDefaults:
    """The defaults of ``model_dir/generation_config.json``; no defaults when there is no
    such file.

    Raises:
        ValueError: the file is not a JSON object, or a key has the wrong type (names both).
    """
    path = os.path.join(model_dir, GENERATION_CONFIG_FILE)
    if not os.path.isfile(path):
        return GenerationDefaults()
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    values: dict[str, Any] = {k: _number(data.get(k), k, path, False) for k in _FLOAT_KEYS}
    values.update({k: _number(data.get(k), k, path, True) for k in _INT_KEYS})
    return GenerationDefaults(eos_token_ids=_eos_ids(data.get("eos_token_id"), path), **values)
