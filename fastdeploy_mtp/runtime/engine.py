"""The reference engine's generation loop and its metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..config import FDConfig
from ..constants import PLACEHOLDER_TOKEN_ID
from ..models.interfaces import MTPModel, TargetModel
from .request import Request, RequestType
from .scheduler import Scheduler
from .target_runner import StepOutput, TargetRunner


@dataclass
class Metrics:
    """Speculation statistics of one run.

    Attributes:
        target_forwards: target forward passes (engine steps that ran the model).
        decode_item_steps: (slot, step) pairs that decoded.
        emitted_tokens: tokens emitted by those decode steps.
        proposed: ``[K]`` drafts offered at draft position ``i + 1``.
        accepted: ``[K]`` drafts accepted at draft position ``i + 1``.
        generated_tokens: all generated tokens (prefill's first tokens included).
        wall_seconds: wall time of the loop.
    """

    target_forwards: int = 0
    decode_item_steps: int = 0
    emitted_tokens: int = 0
    proposed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    generated_tokens: int = 0
    wall_seconds: float = 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per decoding item per target forward (1.0 = no speculation gain)."""
        return self.emitted_tokens / self.decode_item_steps if self.decode_item_steps else 0.0

    @property
    def acceptance_per_position(self) -> list[float | None]:
        """Share of offered drafts accepted, per draft position 1..K (``None`` where no draft
        was ever offered, e.g. positions past ``num_model_steps`` without the n-gram hybrid)."""
        return [float(a / p) if p else None for a, p in zip(self.accepted, self.proposed)]

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.wall_seconds if self.wall_seconds else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "target_forwards": self.target_forwards,
            "generated_tokens": self.generated_tokens,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "acceptance_per_position": [None if a is None else round(a, 4) for a in self.acceptance_per_position],
            "tokens_per_second": round(self.tokens_per_second, 2),
            "wall_seconds": round(self.wall_seconds, 3),
        }


class Engine:
    """Continuous-batching generation with optional MTP speculation (greedy).

    Args:
        fd_config: serving config (``speculative_config.method = None`` for plain decoding).
        model: the target model; mtp_model: its MTP layer (when speculating).
        prefill_chunk_size: see :class:`~fastdeploy_mtp.runtime.scheduler.Scheduler`.
    """

    def __init__(
        self,
        fd_config: FDConfig,
        model: TargetModel,
        mtp_model: MTPModel | None = None,
        prefill_chunk_size: int = 0,
        record_trace: bool = False,
    ):
        self.fd_config = fd_config
        #: with ``record_trace``: one ``(step, request_id, task, emitted tokens, drafts)``
        #: tuple per slot and target forward, for tests and debugging.
        self.trace: list[tuple] | None = [] if record_trace else None
        self.runner = TargetRunner(fd_config, model, mtp_model)
        self.scheduler = Scheduler(fd_config, prefill_chunk_size)
        k = fd_config.speculative_config.num_speculative_tokens if fd_config.speculative_config.enabled else 0
        self.metrics = Metrics(proposed=np.zeros(k, np.int64), accepted=np.zeros(k, np.int64))

    def close(self) -> None:
        """Release the MTP layer's caches (detach / unpublish shared ones)."""
        if self.runner.proposer is not None:
            self.runner.proposer.clear_mtp_cache()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        requests: Sequence[Request],
        progress: Callable[[int, int], None] | None = None,
        max_steps: int = 1_000_000,
    ) -> dict[str, list[int]]:
        """Run every request to completion (EOS or ``max_tokens``); returns the generated ids
        per ``request_id``. ``progress(done, total)`` is called as requests finish."""
        for req in requests:
            self.scheduler.add_request(req)
        total, done = len(requests), 0
        results: dict[str, list[int]] = {}
        start = time.perf_counter()
        step = 0
        while self.scheduler.has_work:
            if step >= max_steps:
                raise RuntimeError(f"generation did not finish within {max_steps} engine steps")
            decode_lens = self.runner.share_inputs.seq_lens_this_time.numpy()
            tasks = self.scheduler.schedule(step, decode_lens)
            step += 1
            if not tasks:
                continue
            self.runner.insert_tasks(tasks)
            out = self.runner.execute()
            self.metrics.target_forwards += 1
            for req in tasks:
                if req.task_type == RequestType.PREFILL and not req.is_final_chunk:
                    continue
                idx = req.idx
                n = int(out.accept_num[idx])
                req.output_token_ids.extend(int(t) for t in out.accept_tokens[idx, :n])
                self.metrics.generated_tokens += n
                if req.task_type == RequestType.DECODE:
                    self._count(out, idx, n)
                if self.trace is not None:
                    self.trace.append(
                        (
                            step,
                            req.request_id,
                            req.task_type.name,
                            [int(t) for t in out.accept_tokens[idx, :n]],
                            [int(d) for d in out.drafts[idx]],
                        )
                    )
                if out.stop_flags[idx]:
                    self.runner.free_slot(idx)
                    results[req.request_id] = list(self.scheduler.finish(idx).output_token_ids)
                    done += 1
                    if progress is not None:
                        progress(done, total)
        self.metrics.wall_seconds += time.perf_counter() - start
        return results

    def _count(self, out: StepOutput, idx: int, emitted: int) -> None:
        m = self.metrics
        m.decode_item_steps += 1
        m.emitted_tokens += emitted
        drafts = out.drafts[idx]
        for i in range(drafts.shape[0]):
            if drafts[i] == PLACEHOLDER_TOKEN_ID:
                continue
            m.proposed[i] += 1
            # greedy verify emits the accepted drafts, then the target's own token, which
            # differs from the draft it rejected: draft i + 1 counts as accepted iff emitted
            # token i equals it
            if i < emitted and int(out.accept_tokens[idx, i]) == int(drafts[i]):
                m.accepted[i] += 1
