"""What every engine command's arguments share: :class:`UsageError` (a bad argument, exit
status 2), the argparse value types (one definition per kind of number, so a bad value reads
the same on every command) and :func:`options_from_args`, which turns parsed arguments into
a command's options dataclass."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from ..config.validators import parse_number

_Options = TypeVar("_Options")


class UsageError(ValueError):
    """A bad command-line argument (exit status 2)."""


def options_from_args(cls: type[_Options], args: argparse.Namespace, **resolved: Any) -> _Options:
    """The options dataclass ``cls`` (e.g. ``ServeOptions``) of a command's parsed ``args``:
    each field from the argument of the same name, or from ``resolved`` (the values a
    resolver built from the raw arguments, e.g. ``speculative_config``); fields with neither
    keep their defaults."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given = {name: value for name, value in vars(args).items() if name in names}
    return cls(**{**given, **resolved})


# ---- argparse value types -------------------------------------------------------------------
# One definition per kind of number, so a bad value reads the same on every command: argparse
# prefixes the flag ("argument --max-tokens: must be > 0, got 0").
def _number(text: str, kind: type[int] | type[float], least: float, strict: bool) -> Any:
    return parse_number(text, kind, least, strict, argparse.ArgumentTypeError)


def positive_int(text: str) -> int:
    """argparse ``type``: an integer > 0."""
    return int(_number(text, int, 0, strict=True))


def non_negative_int(text: str) -> int:
    """argparse ``type``: an integer >= 0."""
    return int(_number(text, int, 0, strict=False))


#: the highest TCP port number
MAX_PORT = 65535


def port_number(text: str) -> int:
    """argparse ``type``: a TCP port, 1..65535 (a larger number would wrap around, modulo
    65536, to another port)."""
    port = positive_int(text)
    if port > MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be a TCP port, 1..{MAX_PORT}, got {text}")
    return port


def positive_float(text: str) -> float:
    """argparse ``type``: a number > 0."""
    return float(_number(text, float, 0, strict=True))
