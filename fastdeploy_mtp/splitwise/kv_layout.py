"""The KV caches a prefill and a decode instance exchange, and the checks of their shape.

Caches, on either side, are given per tensor-parallel rank as a list of arrays in the order of
the model's cache spec (:mod:`fastdeploy_mtp.models.cache_spec`: ``key0, value0, key1, value1,
...`` of the target's layers, then of every MTP layer), each a numpy array ``[num_blocks,
*block_shape]`` (``[num_blocks, kv_heads_per_rank, block_size, head_dim]`` for key/value
caches; ``cache[b]`` is block ``b``). :class:`KVLayout` carries that spec; P and D may have
different block counts, every other part of it must agree.

Every refusal of the KV transfer is a :class:`TransferError` whose message names the
request, the peer or the argument/field at fault; the small checks here write those
messages the same way for every caller (``where`` is the message's prefix).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..models.cache_spec import CACHE_KINDS, CACHE_OWNERS, CacheSpec

__all__ = [
    "HOST_DTYPES",
    "CacheEntry",
    "Caches",
    "KVLayout",
    "TransferError",
    "block_id_list",
    "check_caches",
    "int_field",
    "nonempty_str",
    "positive_number",
]


#: One instance's caches: per rank, one array ``[num_blocks, *block_shape]`` per entry of its
#: :attr:`KVLayout.caches`.
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


#: Cache dtypes a layout may name, with the numpy dtype of their host views (numpy has no
#: bfloat16: its bits travel as int16).
HOST_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "int16"}
#: The keys of a cache's JSON form (``CacheSpec.to_dict``), in order.
_ENTRY_KEYS = tuple(f.name for f in fields(CacheSpec))


class CacheEntry(CacheSpec):
    """One cache of one rank, as the model's cache spec describes it: a
    :class:`~fastdeploy_mtp.models.cache_spec.CacheSpec` (its fields, its JSON form) read from
    a peer, so a bad field is a :class:`TransferError` that names it.

    Attributes:
        owner: ``"target"`` or ``"mtp"``.
        layer: the owner's layer index.
        kind: ``"key"``, ``"value"`` or ``"latent"``.
        shape: ``[num_blocks, *block_shape]`` on the instance that described it.
        dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``.
    """

    def __post_init__(self) -> None:
        where = f"KV layout cache {self.owner!r} {self.layer!r} {self.kind!r}"
        if self.owner not in CACHE_OWNERS:
            raise TransferError(f"{where}: `owner` must be 'target' or 'mtp', got {self.owner!r}")
        int_field(self.layer, "layer", 0, where)
        if self.kind not in CACHE_KINDS:
            raise TransferError(
                f"{where}: `kind` must be 'key', 'value' or 'latent', got {self.kind!r}"
            )
        if not isinstance(self.shape, tuple | list) or len(self.shape) < 2:
            raise TransferError(
                f"{where}: `shape` must be a list of 2 or more ints, got {self.shape!r}"
            )
        object.__setattr__(
            self, "shape", tuple(int_field(d, "shape", 1, where) for d in self.shape)
        )
        if self.dtype not in HOST_DTYPES:
            raise TransferError(
                f"{where}: `dtype` must be one of {sorted(HOST_DTYPES)}, got {self.dtype!r}"
            )

    @property
    def host_dtype(self) -> str:
        """The numpy dtype of this cache's host arrays (:data:`HOST_DTYPES`)."""
        return HOST_DTYPES[self.dtype]

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of this cache."""
        return math.prod(self.block_shape) * np.dtype(self.host_dtype).itemsize

    @property
    def label(self) -> str:
        return f"{self.owner} layer {self.layer} {self.kind}"


@dataclass(frozen=True)
class KVLayout:
    """The caches a prefill and a decode instance exchange: every cache of every rank.

    Attributes:
        tensor_parallel_size: ranks, each with its own caches, all described by ``caches``.
        caches: one rank's caches in their order (the model's cache spec: target layers, then
            MTP layers). Two instances' layouts match when everything but the block counts
            (``shape[0]``) agrees.
    """

    tensor_parallel_size: int
    caches: tuple[CacheEntry, ...]

    def __post_init__(self) -> None:
        int_field(self.tensor_parallel_size, "tensor_parallel_size", 1, "KVLayout")
        if not isinstance(self.caches, tuple | list) or not self.caches:
            raise TransferError(
                f"KVLayout: `caches` must be a non-empty sequence, got {self.caches!r}"
            )
        if not all(isinstance(c, CacheEntry) for c in self.caches):
            raise TransferError("KVLayout: `caches` must hold CacheEntry objects")
        object.__setattr__(self, "caches", tuple(self.caches))

    @property
    def num_caches(self) -> int:
        """Cache tensors per rank."""
        return len(self.caches)

    def count(self, owner: str) -> int:
        """Caches per rank that ``owner`` (``"target"`` or ``"mtp"``) has."""
        return sum(c.owner == owner for c in self.caches)

    @property
    def block_nbytes(self) -> int:
        """Bytes of one block of every cache of one rank together."""
        return sum(c.block_nbytes for c in self.caches)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict that :meth:`from_dict` reads back; ``caches`` is the cache spec's
        JSON form (``fastdeploy_mtp.models.cache_spec.describe``)."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "caches": [c.to_dict() for c in self.caches],
        }

    @classmethod
    def from_description(cls, tensor_parallel_size: int, description: Any) -> KVLayout:
        """The layout of ``tensor_parallel_size`` ranks holding the caches ``description``
        lists (``cache_spec.describe``'s form). Raises :class:`TransferError` naming the entry."""
        if not isinstance(description, list) or not description:
            raise TransferError(
                f"KV layout: `caches` must be a non-empty list, got {description!r:.80}"
            )
        entries = []
        for i, d in enumerate(description):
            if not isinstance(d, dict) or set(d) != set(_ENTRY_KEYS):
                keys = sorted(d) if isinstance(d, dict) else type(d).__name__
                raise TransferError(
                    f"KV layout: `caches[{i}]` must have the keys {list(_ENTRY_KEYS)}, got {keys}"
                )
            try:
                entry = CacheEntry(**{key: d[key] for key in _ENTRY_KEYS})
            except TransferError as exc:
                raise TransferError(
                    f"KV layout: `caches[{i}]`: {str(exc).split(': ', 1)[1]}"
                ) from None
            entries.append(entry)
        return cls(tensor_parallel_size, tuple(entries))

    @classmethod
    def from_dict(cls, d: Any) -> KVLayout:
        """The layout :meth:`to_dict` wrote. Raises :class:`TransferError` naming a missing,
        unknown or ill-typed key."""
        if not isinstance(d, dict):
            raise TransferError(f"KV layout must be a dict, got {type(d).__name__}")
        for key in ("tensor_parallel_size", "caches"):
            if key not in d:
                raise TransferError(f"KV layout: missing key `{key}`")
        for key in d:
            if key not in ("tensor_parallel_size", "caches"):
                raise TransferError(f"KV layout: unknown key `{key}`")
        return cls.from_description(d["tensor_parallel_size"], d["caches"])

    def check_matches(self, other: KVLayout) -> None:
        """Refuse a decode instance whose layout (``other``) differs from this (the
        prefill's) one in anything but the block counts.

        Raises:
            TransferError: one line naming the first differing cache (owner, layer, kind,
                then its block shape or dtype), or the differing rank or cache count.
        """
        mine, theirs = self.tensor_parallel_size, other.tensor_parallel_size
        if mine != theirs:
            raise TransferError(
                f"KV layout mismatch in `tensor_parallel_size`: prefill has {mine}, this decode "
                f"instance has {theirs}"
            )
        for i, (p, d) in enumerate(zip(self.caches, other.caches)):
            what = None
            if (p.owner, p.layer, p.kind) != (d.owner, d.layer, d.kind):
                what = f"prefill has {p.label}, this decode instance has {d.label}"
            elif p.block_shape != d.block_shape:
                what = (
                    f"block shape {list(p.block_shape)} on the prefill, {list(d.block_shape)} here"
                )
            elif p.dtype != d.dtype:
                what = f"dtype {p.dtype} on the prefill, {d.dtype} here"
            if what is not None:
                raise TransferError(f"KV layout mismatch in cache {i} ({p.label}): {what}")
        if self.num_caches != other.num_caches:
            longer = self.caches if self.num_caches > other.num_caches else other.caches
            raise TransferError(
                f"KV layout mismatch: the prefill has {self.num_caches} caches per rank, this "
                f"decode instance {other.num_caches} (first unmatched: "
                f"{longer[min(self.num_caches, other.num_caches)].label})"
            )

    @classmethod
    def of_caches(cls, caches: Caches, description: Any) -> KVLayout:
        """The layout of ``caches`` (per rank, one host array per entry of ``description``,
        the cache spec's JSON form), checked against it.

        Raises:
            TransferError: no ranks, a bad description, or arrays that do not fit it.
        """
        if not isinstance(caches, Sequence) or not caches:
            raise TransferError(
                "KVLayout.of_caches: `caches` must be a non-empty sequence (one entry per rank)"
            )
        layout = cls.from_description(len(caches), description)
        check_caches(caches, layout, "KVLayout.of_caches", writable=False)
        return layout


def check_caches(caches: Any, layout: KVLayout, where: str, writable: bool) -> int:
    """Check ``caches`` (per rank, one array per entry of ``layout.caches``, ``[num_blocks,
    *block_shape]`` of its host dtype, writable if ``writable``, every cache with the same
    ``num_blocks``) against ``layout``; returns that block count."""
    if not isinstance(caches, Sequence) or len(caches) != layout.tensor_parallel_size:
        got = len(caches) if isinstance(caches, Sequence) else type(caches).__name__
        raise TransferError(
            f"{where}: `caches` must hold {layout.tensor_parallel_size} rank(s), got {got}"
        )
    num_blocks = None
    for r, rank in enumerate(caches):
        if not isinstance(rank, Sequence) or len(rank) != layout.num_caches:
            got = len(rank) if isinstance(rank, Sequence) else type(rank).__name__
            raise TransferError(
                f"{where}: `caches[{r}]` must hold {layout.num_caches} arrays "
                f"({layout.count('target')} target + {layout.count('mtp')} MTP caches), got {got}"
            )
        for c, (arr, entry) in enumerate(zip(rank, layout.caches)):
            name = f"`caches[{r}][{c}]` ({entry.label})"
            if not isinstance(arr, np.ndarray):
                raise TransferError(
                    f"{where}: {name} must be a numpy array, got {type(arr).__name__}"
                )
            if arr.ndim != len(entry.shape) or tuple(arr.shape[1:]) != entry.block_shape:
                raise TransferError(
                    f"{where}: {name} has shape {list(arr.shape)}, expected "
                    f"[num_blocks, {', '.join(map(str, entry.block_shape))}]"
                )
            if arr.dtype.name != entry.host_dtype:
                raise TransferError(
                    f"{where}: {name} has dtype {arr.dtype.name}, expected {entry.host_dtype}"
                )
            if num_blocks is None:
                num_blocks = arr.shape[0]
            elif arr.shape[0] != num_blocks:
                raise TransferError(
                    f"{where}: {name} has {arr.shape[0]} blocks, `caches[0][0]` has {num_blocks}"
                )
            if writable and not arr.flags.writeable:
                raise TransferError(f"{where}: {name} is read-only; the blocks are copied into it")
    assert num_blocks is not None
    return int(num_blocks)


def block_id_list(ids: Any, num_blocks: int, name: str, where: str) -> list[int]:
    """``ids`` (a sequence or an integer array) as a list of distinct ints in
    ``[0, num_blocks)``."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence | np.ndarray):
        raise TransferError(
            f"{where}: `{name}` must be a sequence of block ids, got {type(ids).__name__}"
        )
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
