"""How many KV blocks, batch slots and batched tokens a deployment gets, and the ``FDConfig``
they build (:func:`build_config`).

The rule ``serve`` follows (documented in ``serve --help`` and the user guide, docs/serving.md):

* **KV blocks from memory.** ``--kv-cache-memory SIZE`` is the bytes of KV cache each rank
  may hold (every target layer's and every MTP layer's key and value caches). Default
  (``auto``): :data:`AUTO_MEMORY_FRACTION` of the host's available memory (the host stands in
  for the accelerator here), at most half the free space of ``/dev/shm`` (where the cache
  manager publishes the caches) shared by the ranks. Blocks = budget // bytes of one block.
* **Slots from blocks.** ``--max-num-seqs`` defaults to
  ``min(256, blocks // blocks of a typical request)``, a typical request being
  :data:`TYPICAL_LEN_DIVISOR` times shorter than ``--max-model-len`` (plus the ``2K + 2``
  lookahead the scheduler reserves): requests wait for blocks when many long ones run at once.
* **Never more blocks than the slots can use**: ``min(budget blocks, slots * blocks of a
  max_model_len request)`` (the cache is not larger than it can ever be filled).
* ``--max-num-batched-tokens`` defaults to ``max(256, max_num_seqs * (K+1) + 64)``: every
  slot's decode row with its drafts, and room for prefill chunks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import CacheConfig, FDConfig, ModelConfig, SchedulerConfig, SpeculativeConfig
from .models.model_config import has_linear_attention

if TYPE_CHECKING:
    from .models.model_config import ModelConfig as ArchConfig

#: the most slots a default ``--max-num-seqs`` gives (vLLM's default)
MAX_DEFAULT_SLOTS = 256
#: share of the host's available memory an ``auto`` KV budget takes (all ranks together)
AUTO_MEMORY_FRACTION = 0.10
#: a typical request is ``max_model_len / TYPICAL_LEN_DIVISOR`` tokens long
TYPICAL_LEN_DIVISOR = 4
#: extra blocks per request past its tokens: the scheduler's lookahead (``2K + 2`` positions)
LOOKAHEAD_BLOCKS = 3

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_memory(text: str) -> int | None:
    """``--kv-cache-memory``'s value in bytes: ``auto`` (``None``) or a number with an
    optional unit (``k``/``M``/``G``, or ``KiB``/``MiB``/``GiB``; ``B`` optional), > 0.
    Raises ``ValueError`` naming what it cannot read."""
    if text.strip().lower() == "auto":
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]i?)?[bB]?\s*", text)
    if m is None:
        raise ValueError(f"must be auto or a size such as 512MiB or 2G, got {text!r}")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]
    if value < 1:
        raise ValueError(f"must be > 0 bytes, got {text!r}")
    return int(value)


def blocks_per_request(tokens: int, block_size: int) -> int:
    """KV blocks one request of ``tokens`` positions holds, with the lookahead."""
    return -(-tokens // block_size) + LOOKAHEAD_BLOCKS


def auto_kv_memory(tp: int) -> int:
    """The ``auto`` KV budget of one rank in bytes (see the module's rule)."""
    available = _meminfo_available()
    shm = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
    budget = int(available * AUTO_MEMORY_FRACTION)
    if shm is not None:
        budget = min(budget, shm.f_bavail * shm.f_frsize // 2)
    return max(1, budget // tp)


def _meminfo_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


@dataclass(frozen=True)
class Capacity:
    """What :func:`plan_capacity` decided: ``max_num_seqs`` slots, ``total_block_num`` KV
    blocks per cache, ``max_num_batched_tokens`` per step, and the budget they came from."""

    max_num_seqs: int
    total_block_num: int
    max_num_batched_tokens: int
    kv_memory: int
    block_bytes: int

    def describe(self) -> str:
        """For the start-up ``config:`` line."""
        mib = self.total_block_num * self.block_bytes / 2**20
        return (
            f"{self.max_num_seqs} slots, {self.total_block_num} KV blocks ({mib:.0f} MiB per "
            f"rank), {self.max_num_batched_tokens} batched tokens"
        )


def plan_capacity(
    *,
    block_size: int,
    block_bytes: int,
    max_model_len: int,
    k: int,
    max_num_seqs: int | None,
    slot_cap: int,
    kv_memory: int | None,
    tp: int,
    max_num_batched_tokens: int | None,
    slot_bytes: int = 0,
) -> Capacity:
    """Slots, blocks and batched tokens by the module's rule. ``block_bytes``: one block of
    every cache of a rank; ``slot_bytes``: what every slot holds besides its blocks (a hybrid
    model's linear-attention states, per rank), taken from the budget first; ``slot_cap``: the
    most slots the token channel carries (a default takes at most that many; ``max_num_seqs``
    is checked against it by the caller); ``kv_memory``: bytes per rank (``None``:
    :func:`auto_kv_memory`). Raises ``ValueError`` naming the flag whose value cannot work."""
    budget = auto_kv_memory(tp) if kv_memory is None else kv_memory
    full = blocks_per_request(max_model_len, block_size)
    if max_num_seqs is None:
        typical = blocks_per_request(max(1, max_model_len // TYPICAL_LEN_DIVISOR), block_size)
        fit = budget // (typical * block_bytes + slot_bytes)
        max_num_seqs = max(1, min(MAX_DEFAULT_SLOTS, slot_cap, fit))
    budget_blocks = max(0, budget - max_num_seqs * slot_bytes) // block_bytes
    if budget_blocks < full:
        states = f" after {max_num_seqs} slots' states of {slot_bytes} bytes" if slot_bytes else ""
        raise ValueError(
            f"--kv-cache-memory {budget} bytes holds {budget_blocks} KV blocks of {block_bytes} "
            f"bytes{states}; one request of --max-model-len {max_model_len} needs {full}: give "
            "more memory or a smaller --max-model-len"
        )
    blocks = min(budget_blocks, max_num_seqs * full)
    least = max_num_seqs * (k + 1) + 1
    tokens = (
        max(256, max_num_seqs * (k + 1) + 64)
        if max_num_batched_tokens is None
        else max_num_batched_tokens
    )
    if tokens < least:
        raise ValueError(
            f"--max-num-batched-tokens {tokens}: must be at least max_num_seqs * (K + 1) + 1 = "
            f"{least} ({max_num_seqs} slots, K = {k}) so that prefill progresses while every slot "
            "decodes"
        )
    return Capacity(max_num_seqs, blocks, tokens, budget, block_bytes)


#: The ops' ``end_tokens`` of a model without any EOS id and without a padded vocabulary: no
#: token equals it, so every request runs to ``max_tokens``.
NO_EOS = -1


def end_tokens(eos_token_ids: list[int], vocab_size: int, ori_vocab_size: int) -> list[int]:
    """The ops' ``end_tokens`` of a model: its EOS ids (every id of ``generation_config.json``
    and ``config.json``). A model that names none ends requests at ``max_tokens``: its last
    padded id when the vocabulary is padded (``ori_vocab_size < vocab_size``; the model can never
    produce it, and a grammar that has completed forces it, which is how a constrained output of
    the byte model ends), else ``[NO_EOS]``. No vocabulary id of an unpadded model stands in: it
    would be a real token."""
    if eos_token_ids:
        return list(eos_token_ids)
    return [vocab_size - 1] if ori_vocab_size < vocab_size else [NO_EOS]


def build_config(
    arch: ArchConfig,
    spec: SpeculativeConfig,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int | None = None,
    total_block_num: int | None = None,
) -> FDConfig:
    """FDConfig for the tiny checkpoint's architecture ``arch`` with speculation ``spec``
    (``SpeculativeConfig(method=None)`` for plain decoding). The ops' ``end_tokens`` are the
    model's EOS ids (:func:`end_tokens`). ``max_num_batched_tokens`` (``None``:
    ``max(256, max_num_seqs * (K+1) + 64)``) and ``total_block_num`` (``None``: ``max_num_seqs``
    requests of ``max_model_len``). Prefix caching is on, except for a model with
    linear-attention layers (:func:`~.models.model_config.has_linear_attention`)."""
    w = (spec.num_speculative_tokens if spec.enabled else 0) + 1
    if max_num_batched_tokens is None:
        max_num_batched_tokens = max(256, max_num_seqs * w + 64)
    if total_block_num is None:
        total_block_num = max_num_seqs * blocks_per_request(max_model_len, arch.block_size)
    return FDConfig(
        model_config=ModelConfig(
            max_model_len=max_model_len,
            vocab_size=arch.vocab_size,
            ori_vocab_size=arch.ori_vocab_size,
            hidden_size=arch.hidden_size,
            num_hidden_layers=arch.num_hidden_layers,
            eos_token_id=end_tokens(arch.eos_token_ids, arch.vocab_size, arch.ori_vocab_size),
        ),
        speculative_config=spec,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens
        ),
        cache_config=CacheConfig(
            block_size=arch.block_size,
            total_block_num=total_block_num,
            # a cached block cannot restore a linear-attention layer's recurrent state
            enable_prefix_caching=not has_linear_attention(arch),
        ),
    )
