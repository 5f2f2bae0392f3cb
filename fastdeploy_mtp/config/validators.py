"""The value checks every config reader shares: a value (from ``config.json``,
``generation_config.json``, a speculative config, a dataclass field or a command-line
argument) that must be an integer, a number, a flag or one of a few choices.

Each check returns the value (converted where the kind says so) or raises ``error`` (a
``ValueError`` unless the caller passes its own exception class or factory) with one line
that starts with the caller's ``label``, e.g. ``config.json `hidden_size` must be an
integer, got '64'``: the label is how the caller names the key, so every reader keeps its
own spelling of the bad key while the wording of the refusal is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: Builds the exception a check raises from its one-line message.
ErrorFactory = Callable[[str], Exception]


def given(raw: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``raw[key]``, or ``default`` when the key is absent or null (JSON's ``null``)."""
    value = raw.get(key)
    return default if value is None else value


def integer(
    value: Any, label: str, minimum: int | None = None, error: ErrorFactory = ValueError
) -> int:
    """``value`` when it is an integer (``true`` / ``false`` are not) of at least ``minimum``.

    Raises:
        error: ``"{label} must be an integer, got {value!r}"`` or
            ``"{label} must be >= {minimum}, got {value}"``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{label} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise error(f"{label} must be >= {minimum}, got {value}")
    return value


def number(value: Any, label: str, error: ErrorFactory = ValueError) -> float:
    """``value`` as a float when it is an integer or a float (not a bool).

    Raises:
        error: ``"{label} must be a number, got {value!r}"``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{label} must be a number, got {value!r}")
    return float(value)


def positive_number(
    value: Any, label: str, allow_zero: bool = False, error: ErrorFactory = ValueError
) -> float:
    """``value`` as a float when it is a number > 0 (>= 0 with ``allow_zero``; NaN is refused).

    Raises:
        error: ``"{label} must be a number > 0, got {value!r}"`` (``>= 0`` with
            ``allow_zero``).
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value >= 0 if allow_zero else value > 0)
    ):
        bound = ">= 0" if allow_zero else "> 0"
        raise error(f"{label} must be a number {bound}, got {value!r}")
    return float(value)


def flag(value: Any, label: str, error: ErrorFactory = ValueError) -> bool:
    """``value`` when it is ``True`` or ``False``.

    Raises:
        error: ``"{label} must be true or false, got {value!r}"``.
    """
    if not isinstance(value, bool):
        raise error(f"{label} must be true or false, got {value!r}")
    return value


def one_of(value: Any, allowed: tuple[Any, ...], label: str) -> None:
    """Refuse ``value`` unless it is one of ``allowed``.

    Raises:
        ValueError: ``"{label} must be one of {allowed}, got {value!r}"``.
    """
    if value not in allowed:
        raise ValueError(f"{label} must be one of {allowed}, got {value!r}")


def positive_fields(obj: object, *names: str, allow_zero: bool = False) -> None:
    """Refuse a dataclass whose attributes ``names`` are not > 0 (>= 0 with ``allow_zero``).

    Raises:
        ValueError: ``"{Class}.{name} must be > 0, got {value}"`` (``>= 0`` with
            ``allow_zero``) for the first attribute out of range.
    """
    for name in names:
        value = getattr(obj, name)
        if value < 0 or (value == 0 and not allow_zero):
            kind = ">= 0" if allow_zero else "> 0"
            raise ValueError(f"{type(obj).__name__}.{name} must be {kind}, got {value}")


def fraction_fields(obj: object, *names: str) -> None:
    """Refuse a dataclass whose attributes ``names`` are not in ``[0, 1]``.

    Raises:
        ValueError: ``"{Class}.{name} must be in [0, 1], got {value}"`` for the first one out
            of range.
    """
    for name in names:
        value = getattr(obj, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{type(obj).__name__}.{name} must be in [0, 1], got {value}")


def parse_number(
    text: str, kind: type[int] | type[float], least: float, strict: bool, error: ErrorFactory
) -> Any:
    """``text`` (a command-line value) as ``kind``, above ``least`` (``strict``) or at least
    ``least``; NaN is refused.

    Raises:
        error: ``"must be an integer, got '{text}'"`` (``"a number"`` for floats) or
            ``"must be > {least}, got {text}"`` (``>=`` unless ``strict``); argparse puts the
            flag in front.
    """
    try:
        value = kind(text)
    except ValueError:
        raise error(
            f"must be {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if not (value > least if strict else value >= least):  # `not`: NaN fails both comparisons
        raise error(f"must be {'>' if strict else '>='} {least:g}, got {text}")
    return value
