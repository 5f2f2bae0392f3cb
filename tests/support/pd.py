"""A prefill engine and a decode engine in one process, handing requests over as the
serving instances do (slot state + KV blocks of every layer), for equivalence tests."""

from __future__ import annotations

import copy

import numpy as np

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.config import FDConfig
from fastdeploy_mtp.runtime.request import Request


def role_config(cfg: FDConfig, role: str) -> FDConfig:
    """``cfg`` for splitwise ``role``, creating its own caches (one process, no cache manager)."""
    out = copy.deepcopy(cfg)
    out.scheduler_config.splitwise_role = role
    out.cache_config.cache_manager = False
    return out


class LocalPD:
    """Prefill engine -> decode engine, stepped in lock-step (step ``s`` of each per loop).

    KV blocks are copied between the two runners' caches when the decode engine asks for
    them, ``fetch_delay`` loop iterations later (a slow transfer)."""

    def __init__(
        self, cfg: FDConfig, target, mtp, fetch_delay: int = 0, prefill_chunk_size: int = 0
    ):
        self.p = build_engine(
            role_config(cfg, "prefill"), target, mtp, prefill_chunk_size=prefill_chunk_size
        )
        self.d = build_engine(role_config(cfg, "decode"), target, mtp)
        self.d.kv_fetcher = self._queue_fetch
        self.fetch_delay = fetch_delay
        self._fetches: list[tuple[int, Request, list[int]]] = []
        self._offers: dict[str, list[int]] = {}
        self.handoffs: list[str] = []
        #: blocks offered by the prefill engine / copied to the decode engine (fewer when the
        #: decode engine's prefix cache already held some)
        self.offered_blocks = 0
        self.copied_blocks = 0
        self.first_tokens: dict[str, list[int]] = {}
        self.step = 0

    def _queue_fetch(self, req: Request, blocks: list[int]) -> None:
        self._fetches.append((self.step + self.fetch_delay, req, blocks))

    def _copy_blocks(self, req: Request, dst: list[int]) -> None:
        """Copy the offered blocks past those the decode engine's prefix cache gave it
        (``req.num_cached_tokens``), as ``pull_blocks(skip=...)`` does."""
        src = self._offers.pop(req.request_id)
        assert len(dst) >= len(src), (src, dst)
        skip = req.num_cached_tokens // self.d.fd_config.cache_config.block_size
        assert 0 <= skip < len(src), (skip, src)
        for a, b in zip(self.p.runner.host_caches()[0], self.d.runner.host_caches()[0]):  # type: ignore[attr-defined]
            b[np.asarray(dst[skip : len(src)])] = a[np.asarray(src[skip:])]
        self.copied_blocks += len(src) - skip
        self.offered_blocks += len(src)
        self.p.release_handoff(req.request_id)

    def run(self, requests: list[Request], max_steps: int = 10_000) -> dict[str, list[int]]:
        self.p.add_requests(requests)
        results: dict[str, list[int]] = {}
        while self.p.has_work or self.d.has_work or self._fetches:
            assert self.step < max_steps, "did not finish"
            ev = self.p.step(self.step)
            assert not ev.failed, ev.failed
            for req in ev.finished:
                results[req.request_id] = list(req.output_token_ids)
            for h in ev.handed_off:
                self._offers[h.request.request_id] = h.blocks
                self.handoffs.append(h.request.request_id)
                self.first_tokens[h.request.request_id] = list(h.request.output_token_ids)
                self.d.add_transferred(
                    Request(
                        h.request.request_id,
                        list(h.request.prompt_token_ids),
                        max_tokens=h.request.max_tokens,
                        output_token_ids=list(h.request.output_token_ids),
                        handoff_state=h.state,
                        sampling=h.request.sampling,
                    )
                )
            due = [f for f in self._fetches if f[0] <= self.step]
            self._fetches = [f for f in self._fetches if f[0] > self.step]
            for _, req, blocks in due:
                self._copy_blocks(req, blocks)
                self.d.transfer_done(req)
            ev = self.d.step(self.step)
            assert not ev.failed, ev.failed
            for req in ev.finished:
                results[req.request_id] = list(req.output_token_ids)
            self.step += 1
        return results

    def close(self) -> None:
        self.p.close()
        self.d.close()
