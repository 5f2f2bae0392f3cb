"""Type checks of a config's keys against the fields of its dataclass: the given keys
only, strictly typed (no ``"3"`` for 3, no ``true`` for an integer), unknown keys refused,
each refusal one line naming the key. pydantic is imported on first use, so a process that
never reads such a config does not load it."""

from __future__ import annotations

import functools
import json
import typing
from collections.abc import Mapping
from dataclasses import fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pydantic

#: How a pydantic type error reads in a config message, by error type.
_TYPE_WORDS = {
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "true or false",
    "float_type": "a number",
}


@functools.cache
def _keys_model(cls: type) -> type[pydantic.BaseModel]:
    """A pydantic model of dataclass ``cls``'s keys, typed as its fields, strict (no ``"3"``
    for 3, no ``true`` for an integer; an integer is taken for a number) and refusing unknown
    keys. Defaults are never validated: :func:`typed_keys` keeps only the keys given
    (``model_fields_set``) and lets the dataclass fill the rest."""
    import pydantic

    hints = typing.get_type_hints(cls)
    keys: dict[str, Any] = {f.name: (hints[f.name], None) for f in fields(cls)}
    return pydantic.create_model(
        f"{cls.__name__}Keys", __config__=pydantic.ConfigDict(strict=True, extra="forbid"), **keys
    )


def typed_keys(
    cls: type, values: Mapping[str, Any], what: str, error: type[ValueError] = ValueError
) -> dict[str, Any]:
    """The keys given in ``values`` for dataclass ``cls``, type-checked against its field
    types; the first problem is a one-line ``error`` naming the key, under ``what`` (e.g.
    ``"speculative config"``). The dataclass's own ``__post_init__`` checks ranges after."""
    import pydantic

    try:
        checked = _keys_model(cls).model_validate(dict(values))
    except pydantic.ValidationError as exc:
        problem = exc.errors()[0]
        key, value = str(problem["loc"][0]), problem["input"]
        if problem["type"] == "extra_forbidden":
            known = ", ".join(f.name for f in fields(cls))
            raise error(f"{what}: unknown key {key!r}; known keys: {known}") from None
        nullable = type(None) in typing.get_args(typing.get_type_hints(cls)[key])
        want = _TYPE_WORDS.get(problem["type"], problem["msg"]) + (" or null" if nullable else "")
        raise error(
            f"{what}: {key!r} must be {want}, got {json.dumps(value, default=repr)}"
        ) from None
    return {name: getattr(checked, name) for name in checked.model_fields_set}
