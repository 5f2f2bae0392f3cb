"""The KV caches a prefill and a decode instance exchange, and the checks of their shape.

Caches, on either side, are given per tensor-parallel rank as a list of arrays in the order
``key0, value0, key1, value1, ...`` (the target's layers, then the MTP layers), each a
numpy array ``[num_blocks, *block_shape]`` (float32 ``[num_blocks, kv_heads_per_rank,
block_size, head_dim]`` for this project's caches; ``cache[b]`` is block ``b``). P and D may
have different block counts, every other dimension (:class:`KVLayout`) must agree.

Every refusal of the KV transfer is a :class:`TransferError` whose message names the
request, the peer or the argument/field at fault; the small checks here write those
messages the same way for every caller (``where`` is the message's prefix).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Caches",
    "KVLayout",
    "TransferError",
    "block_id_list",
    "check_caches",
    "int_field",
    "nonempty_str",
    "positive_number",
]


#: One instance's caches: per rank, ``key0, value0, ...`` (target layers, then MTP layers),
#: each ``[num_blocks, *block_shape]``.
Caches = Sequence[Sequence[np.ndarray]]


class TransferError(RuntimeError):
    """A KV-block transfer failed or was refused; the message names the request, the peer
    or the argument/field at fault."""


def int_field(value: Any, name: str, minimum: int, where: str) -> int:
    """``value`` as an int ``>= minimum`` (a bool is not an int here)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TransferError(f"{where}: `{name}` must be an int, got {value!r}")
    if value < minimum:
        raise TransferError(f"{where}: `{name}` must be >= {minimum}, got {value}")
    return int(value)


def positive_number(value: Any, name: str, where: str, what: str = "a positive number") -> float:
    """``value`` as a float ``> 0`` (an int or a float, not a bool); ``what`` is how the
    refusal describes a good value, e.g. ``"a positive number of seconds"``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise TransferError(f"{where}: `{name}` must be {what}, got {value!r}")
    return float(value)


def nonempty_str(value: Any, name: str, where: str) -> str:
    """``value`` if it is a non-empty str."""
    if not isinstance(value, str) or not value:
        raise TransferError(f"{where}: `{name}` must be a non-empty str, got {value!r}")
    return value


@dataclass(frozen=True)
class KVLayout:
    """What must agree between the prefill and the decode instance's caches.

    Attributes:
        tensor_parallel_size: ranks, each with its own list of caches.
        num_target_layers: target layers (a key and a value cache each).
        num_mtp_layers: MTP layers after them (a key and a value cache each).
        block_shape: ``cache.shape[1:]`` of every cache on one rank, e.g. ``(kv_heads_per_rank,
            block_size, head_dim)``.
        dtype: numpy dtype name of every cache, e.g. ``"float32"``.
    """

    tensor_parallel_size: int
    num_target_layers: int
    num_mtp_layers: int
    block_shape: tuple[int, ...]
    dtype: str

    _FIELDS = ("tensor_parallel_size", "num_target_layers", "num_mtp_layers", "block_shape", "dtype")

    def __post_init__(self) -> None:
        where = "KVLayout"
        int_field(self.tensor_parallel_size, "tensor_parallel_size", 1, where)
        int_field(self.num_target_layers, "num_target_layers", 1, where)
        int_field(self.num_mtp_layers, "num_mtp_layers", 0, where)
        shape = self.block_shape
        if not isinstance(shape, tuple | list) or not shape:
            raise TransferError(f"{where}: `block_shape` must be a non-empty sequence of ints, got {shape!r}")
        dims = tuple(int_field(d, "block_shape", 1, where) for d in shape)
        object.__setattr__(self, "block_shape", dims)
        if not isinstance(self.dtype, str):
            raise TransferError(f"{where}: `dtype` must be a numpy dtype name (str), got {self.dtype!r}")
        try:
            name = np.dtype(self.dtype).name
        except TypeError:
            name = None
        if name != self.dtype:
            raise TransferError(f"{where}: `dtype` {self.dtype!r} is not a numpy dtype name")

    @property
    def num_caches(self) -> int:
        """Cache tensors per rank: a key and a value for each target and MTP layer."""
        return 2 * (self.num_target_layers + self.num_mtp_layers)

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of one cache tensor (``prod(block_shape) * itemsize``)."""
        return math.prod(self.block_shape) * np.dtype(self.dtype).itemsize

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict that :meth:`from_dict` reads back."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "num_target_layers": self.num_target_layers,
            "num_mtp_layers": self.num_mtp_layers,
            "block_shape": list(self.block_shape),
            "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, d: Any) -> KVLayout:
        """The layout :meth:`to_dict` wrote. Raises :class:`TransferError` naming a missing,
        unknown or ill-typed key."""
        if not isinstance(d, dict):
            raise TransferError(f"KV layout must be a dict, got {type(d).__name__}")
        for key in cls._FIELDS:
            if key not in d:
                raise TransferError(f"KV layout: missing key `{key}`")
        for key in d:
            if key not in cls._FIELDS:
                raise TransferError(f"KV layout: unknown key `{key}`")
        if not isinstance(d["block_shape"], list | tuple):
            raise TransferError(f"KV layout: `block_shape` must be a list of ints, got {d['block_shape']!r}")
        return cls(**{key: d[key] for key in cls._FIELDS})

    def check_matches(self, other: KVLayout) -> None:
        """Refuse a decode instance whose layout differs from this (the prefill's) one.

        Raises:
            TransferError: naming the first differing field with both values.
        """
        for key in self._FIELDS:
            mine, theirs = getattr(self, key), getattr(other, key)
            if mine != theirs:
                raise TransferError(
                    f"KV layout mismatch in `{key}`: prefill has {mine!r}, this decode instance has {theirs!r}"
                )

    @classmethod
    def of_caches(cls, caches: Caches, num_target_layers: int, num_mtp_layers: int) -> KVLayout:
        """The layout of ``caches`` (per rank, ``key0, value0, ...``, target layers first).

        Raises:
            TransferError: a rank without ``2 * (num_target_layers + num_mtp_layers)`` arrays,
                or arrays that differ in shape or dtype.
        """
        if not isinstance(caches, Sequence) or not caches:
            raise TransferError("KVLayout.of_caches: `caches` must be a non-empty sequence (one entry per rank)")
        first = caches[0][0] if isinstance(caches[0], Sequence) and caches[0] else None
        if not isinstance(first, np.ndarray) or first.ndim < 2:
            raise TransferError(
                "KVLayout.of_caches: `caches[0][0]` must be a numpy array [num_blocks, *block_shape], "
                f"got {type(first).__name__}"
            )
        layout = cls(len(caches), num_target_layers, num_mtp_layers, tuple(first.shape[1:]), first.dtype.name)
        check_caches(caches, layout, "KVLayout.of_caches", writable=False)
        return layout


def check_caches(caches: Any, layout: KVLayout, where: str, writable: bool) -> int:
    """Check ``caches`` (per rank, ``layout.num_caches`` arrays ``[num_blocks,
    *layout.block_shape]`` of ``layout.dtype``, writable if ``writable``) against ``layout``;
    returns their common block count."""
    if not isinstance(caches, Sequence) or len(caches) != layout.tensor_parallel_size:
        got = len(caches) if isinstance(caches, Sequence) else type(caches).__name__
        raise TransferError(f"{where}: `caches` must hold {layout.tensor_parallel_size} rank(s), got {got}")
    num_blocks = None
    for r, rank in enumerate(caches):
        if not isinstance(rank, Sequence) or len(rank) != layout.num_caches:
            got = len(rank) if isinstance(rank, Sequence) else type(rank).__name__
            raise TransferError(
                f"{where}: `caches[{r}]` must hold {layout.num_caches} arrays (key and value per "
                f"{layout.num_target_layers} target + {layout.num_mtp_layers} MTP layers), got {got}"
            )
        for c, arr in enumerate(rank):
            if not isinstance(arr, np.ndarray):
                raise TransferError(f"{where}: `caches[{r}][{c}]` must be a numpy array, got {type(arr).__name__}")
            if arr.ndim != 1 + len(layout.block_shape) or tuple(arr.shape[1:]) != layout.block_shape:
                raise TransferError(
                    f"{where}: `caches[{r}][{c}]` has shape {list(arr.shape)}, expected "
                    f"[num_blocks, {', '.join(map(str, layout.block_shape))}]"
                )
            if arr.dtype.name != layout.dtype:
                raise TransferError(f"{where}: `caches[{r}][{c}]` has dtype {arr.dtype.name}, expected {layout.dtype}")
            if num_blocks is None:
                num_blocks = arr.shape[0]
            elif arr.shape[0] != num_blocks:
                raise TransferError(
                    f"{where}: `caches[{r}][{c}]` has {arr.shape[0]} blocks, `caches[0][0]` has {num_blocks}"
                )
            if writable and not arr.flags.writeable:
                raise TransferError(f"{where}: `caches[{r}][{c}]` is read-only; the blocks are copied into it")
    assert num_blocks is not None
    return int(num_blocks)


def block_id_list(ids: Any, num_blocks: int, name: str, where: str) -> list[int]:
    """``ids`` (a sequence or an integer array) as a list of distinct ints in ``[0, num_blocks)``."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence | np.ndarray):
        raise TransferError(f"{where}: `{name}` must be a sequence of block ids, got {type(ids).__name__}")
    out = []
    for i in ids:
        if isinstance(i, bool | np.bool_):
            raise TransferError(f"{where}: `{name}` holds a bool {i!r}, expected block ids")
        try:
            b = operator.index(i)
        except TypeError:
            raise TransferError(f"{where}: `{name}` holds {i!r}, expected int block ids") from None
        if not 0 <= b < num_blocks:
            raise TransferError(f"{where}: `{name}` holds block id {b}, outside [0, {num_blocks})")
        out.append(b)
    if len(set(out)) != len(out):
        dup = next(b for b in out if out.count(b) > 1)
        raise TransferError(f"{where}: `{name}` holds block id {dup} more than once")
    return out
