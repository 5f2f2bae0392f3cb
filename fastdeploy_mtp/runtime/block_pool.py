"""KV blocks of one engine: the free list, reference counts and the prefix cache.

Every KV cache of a deployment (the target's layers and the MTP layers') is indexed by the
same block ids: the proposer copies the target's block table before each round. A block
id therefore names the KV of every layer at its positions, and sharing a block shares all
of it.

Prefix caching (``cache_config.enable_prefix_caching``):

* **What is cached.** Full blocks of a *prompt* only, and only blocks followed by at least
  one more prompt token: block ``i`` (positions ``[iB, (i+1)B)``) is cacheable when
  ``(i+1)B <= len(prompt) - 1``. A hit therefore always leaves at least one prompt token to
  prefill, whose logits give the first output token.
* **The key.** ``sha256(parent key || block tokens || next token)``, the next token being
  ``prompt[(i+1)B]``. The parent key makes a block's key name its whole prefix. The next
  token is there for the MTP layers: the MTP layer's input at position ``p`` is the target's
  hidden state at ``p`` and the token at ``p + 1``, so the MTP KV at a block's last position
  depends on the first token of the *next* block. A target-only key would hand a request
  MTP KV computed for a different continuation. Without an MTP layer (no speculation, or a
  model-free method) the next token is left out of the key. SHA-256 rather than Python's
  ``hash``: a client that could forge a 64-bit collision would read another prompt's KV.
* **Namespaces.** A request's chain starts from its namespace's root key
  (:func:`namespace_root`; the request's ``cache_namespace``), so requests of different
  namespaces never find each other's blocks: the server gives each tenant (API key) and
  ``cache_salt`` its own, and a hit, which shows in the time to the first token, tells a
  client only about its own earlier requests.
* **When.** A block is registered after the step that wrote it succeeded (target and MTP KV
  both written), by :meth:`BlockPool.register`. A request the draft planner admitted
  without the MTP layer writes no MTP KV: its blocks go to a chain of their own
  (:data:`TARGET_ONLY`), which a request that hits it longer than the full chain drafts
  without the MTP layer too. Two requests that computed the same block
  in one step both keep their own copy; the first registered is the one found.
* **Generated tokens are not cached.** The MTP layer's KV at a generated position can be
  left unwritten by a round adaptive drafting skipped and never caught up on when the
  request finished; only prompt KV is known to be complete in every layer.
* **Sharing.** A block holds a reference count (the slots and hand-overs using it). Blocks
  at zero references that carry a key stay in the cache, in least-recently-freed order, and
  count as free: :meth:`allocate` takes a never-cached block first, then evicts the least
  recently freed cached one. A request's blocks are freed tail first, so its deepest blocks
  are evicted before the prefix others share.
* **Read-only.** A hit covers whole blocks and its request prefills from the next block
  boundary, and every writer (prefill chunks, verify rows, MTP substeps) writes only at or
  past its request's committed length, so no request ever writes into a shared block.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

#: Key of the empty prefix (the parent of a prompt's first block).
ROOT_KEY = b"fastdeploy_mtp prefix cache v1"


def namespace_root(namespace: bytes) -> bytes:
    """The key a prompt's chain starts from in ``namespace`` (:data:`ROOT_KEY` for the global
    namespace ``b""``; a digest of both otherwise)."""
    if not namespace:
        return ROOT_KEY
    return hashlib.sha256(ROOT_KEY + b"\0namespace\0" + namespace).digest()


#: Appended to a namespace for the blocks whose MTP layers' KV was never written (prompts
#: of requests the draft planner admitted without the MTP layer): their own key chain.
TARGET_ONLY = b"\0target KV only"


def block_keys(
    tokens: Sequence[int],
    block_size: int,
    include_next: bool,
    namespace: bytes = b"",
    target_only: bool = False,
) -> list[bytes]:
    """Keys of the cacheable full blocks of prompt ``tokens`` (see the module docstring): one
    per block ``i`` with ``(i+1) * block_size <= len(tokens) - 1``, chained from
    :func:`namespace_root` ``(namespace)``. ``include_next``: the key also covers the token
    after the block (a deployment with MTP layers). ``target_only``: the chain of blocks
    without MTP KV (:data:`TARGET_ONLY`)."""
    keys: list[bytes] = []
    parent = namespace_root(namespace + TARGET_ONLY if target_only else namespace)
    for i in range((len(tokens) - 1) // block_size):
        end = (i + 1) * block_size
        body = tokens[i * block_size : end + (1 if include_next else 0)]
        h = hashlib.sha256(parent)
        h.update(np.asarray(body, dtype="<i8").tobytes())  # each token as 8 bytes, little-endian
        parent = h.digest()
        keys.append(parent)
    return keys


class BlockPool:
    """Allocates KV block ids ``0 .. num_blocks - 1`` with reference counts, and keeps the
    prefix cache (see the module docstring).

    Args:
        num_blocks: KV blocks of the deployment (``cache_config.total_block_num``).
        enable_caching: keep freed blocks that carry a key for later hits; ``False``: every
            freed block goes straight back to the free list and :meth:`lookup` finds nothing.
    """

    def __init__(self, num_blocks: int, enable_caching: bool):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        #: blocks with no key and no reference; allocated from the end (lowest id first)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        #: blocks with a key and no reference, least recently freed first
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._refs = [0] * num_blocks
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        #: prompt tokens looked up / found in the cache (the hit rate is hits / queries)
        self.queried_tokens = 0
        self.hit_tokens = 0

    # ---- counts --------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks :meth:`allocate` can hand out: never-cached free ones plus cached ones no
        request references."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached(self) -> int:
        """Blocks that carry a key (referenced or not)."""
        return len(self._key_of)

    def free_ids(self) -> list[int]:
        """Ids of the free blocks (never-cached and evictable), in no particular order."""
        return [*self._free, *self._evictable]

    def refs(self, block: int) -> int:
        """References held on ``block``."""
        return self._refs[block]

    def total_refs(self) -> int:
        """References held on all blocks (0 when no request holds any)."""
        return sum(self._refs)

    # ---- allocation ----------------------------------------------------------------------
    def allocate(self) -> int:
        """A block with one reference: a never-cached free block if there is one, else the
        least recently freed cached block (its key is dropped). Raises ``IndexError`` when
        none is free."""
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            del self._block_of[self._key_of.pop(block)]
        else:
            raise IndexError("no free KV block")
        self._refs[block] = 1
        return block

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each of ``blocks``, last block first; a block left with
        none returns to the cache (it carries a key) or to the free list."""
        for block in reversed(blocks):
            refs = self._refs[block] - 1
            if refs < 0:
                raise RuntimeError(f"KV block {block} freed more often than it was taken")
            self._refs[block] = refs
            if refs:
                continue
            if block in self._key_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    # ---- the prefix cache ----------------------------------------------------------------
    def lookup(self, keys: Sequence[bytes]) -> list[int]:
        """Blocks of the longest run of ``keys`` (from the first) the cache holds; takes no
        reference (see :meth:`take`)."""
        hits: list[int] = []
        if not self.enable_caching:
            return hits
        for key in keys:
            block = self._block_of.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def lookup_longest(self, chains: Sequence[Sequence[bytes]]) -> tuple[int, list[int]]:
        """:meth:`lookup` of each key chain: the index of the chain with the longest hit (the
        first on a tie) and its blocks."""
        best, hits = 0, self.lookup(chains[0])
        for i, keys in enumerate(chains[1:], 1):
            found = self.lookup(keys)
            if len(found) > len(hits):
                best, hits = i, found
        return best, hits

    def count_query(self, queried: int, hit: int) -> None:
        """Count a lookup of ``queried`` prompt tokens of which ``hit`` were found."""
        self.queried_tokens += queried
        self.hit_tokens += hit

    def take(self, blocks: Iterable[int]) -> None:
        """Add a reference to each of ``blocks`` (cache hits); an unreferenced one leaves the
        eviction order."""
        for block in blocks:
            if self._refs[block] == 0:
                self._evictable.pop(block, None)
            self._refs[block] += 1

    def register(self, block: int, key: bytes) -> None:
        """``block`` (referenced, its KV written in every layer) holds the prefix ``key``
        names. Nothing changes if the key already names another block or the block already
        carries a key."""
        if not self.enable_caching or key in self._block_of or block in self._key_of:
            return
        if self._refs[block] <= 0:
            raise RuntimeError(f"KV block {block} registered while no request references it")
        self._key_of[block] = key
        self._block_of[key] = block

    def clear(self) -> int:
        """Forget every key (cached blocks no request references go back to the free list);
        returns how many blocks were dropped from the cache."""
        dropped = len(self._key_of)
        for block in self._evictable:
            self._free.append(block)
        self._evictable.clear()
        self._key_of.clear()
        self._block_of.clear()
        return dropped
