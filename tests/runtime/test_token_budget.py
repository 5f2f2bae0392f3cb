"""The per-step token budget (``scheduler_config.max_num_batched_tokens``,
``serve --max-num-batched-tokens``): every decoding slot runs with its drafts first, then
prefill chunks take what is left, in slot order; a prefix-cache hit only moves where a
prompt's first chunk starts. Output does not depend on the budget."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.runtime.request import Request, RequestType
from fastdeploy_mtp.runtime.scheduler import Scheduler
from tests.support.engines import build_random_model, make_config, make_requests


def tokens_of(task: Request, decode_lens: np.ndarray) -> int:
    if task.task_type == RequestType.PREFILL:
        return task.prefill_end_index - task.prefill_start_index
    return int(decode_lens[task.idx])


def test_decode_rows_first_then_prefill_chunks_up_to_the_budget():
    k, budget = 3, 4 * 4 + 1 + 3  # four slots of K + 1, and 4 tokens for prefill
    cfg = make_config(k, 3, max_num_seqs=4, budget=budget, max_model_len=160)
    cfg.cache_config.enable_prefix_caching = False
    sched = Scheduler(cfg)
    sched.add_requests(
        [Request(f"r{i}", list(range(1, 2 + 7 * (i % 5))), max_tokens=8) for i in range(10)]
    )
    decoded: dict[str, int] = {}
    lens = np.full([4], k + 1, np.int32)
    seen_decode_before_prefill = 0
    for step in range(80):
        started = {i for i, s in sched.slots.items() if s.prefilling and s.prefill_pos > 0}
        tasks = sched.schedule(step, lens)
        # a part-way prefilled prompt is never left without a chunk (its runner state would
        # run on as a decode row): this starved slots 2 and 3 at the smallest budget once
        assert started <= {t.idx for t in tasks if t.task_type == RequestType.PREFILL}, step
        kinds = [t.task_type for t in tasks]
        # decode (and import) tasks all come before any prefill task
        assert kinds == sorted(kinds, key=lambda t: t == RequestType.PREFILL), kinds
        decoding = [t for t in tasks if t.task_type == RequestType.DECODE]
        assert len(decoding) == sum(1 for s in sched.slots.values() if not s.prefilling) - sum(
            1 for t in tasks if t.task_type == RequestType.PREFILL and t.is_final_chunk
        )
        used = sum(tokens_of(t, lens) for t in tasks)
        assert used <= budget, (step, used)
        prefills = [t for t in tasks if t.task_type == RequestType.PREFILL]
        if prefills and decoding:
            seen_decode_before_prefill += 1
        # the budget left after the decode rows is spent on prefill unless no prompt is left
        left = budget - sum(tokens_of(t, lens) for t in decoding)
        remaining = sum(
            len(s.request.prompt_token_ids) - s.prefill_pos for s in sched.slots.values()
        )
        assert sum(tokens_of(t, lens) for t in prefills) == min(
            left, sum(tokens_of(t, lens) for t in prefills) + remaining
        )
        assert [t.idx for t in prefills] == sorted(t.idx for t in prefills)
        for t in decoding:  # a request leaves after two decode steps; the next takes its slot
            decoded[t.request_id] = decoded.get(t.request_id, 0) + 1
            if decoded[t.request_id] == 2:
                sched.finish(t.idx)
    assert seen_decode_before_prefill > 0
    assert not sched.has_work


def test_a_budget_below_every_slot_decoding_is_refused_naming_it():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(make_config(3, 3, max_num_seqs=4, budget=16))


@pytest.mark.parametrize("k", [0, 3])
def test_output_does_not_depend_on_the_budget(k):
    target, mtp = build_random_model()
    reqs = make_requests(10, 6, stagger=1, min_prompt=3, max_prompt=60)
    outs = []
    for budget in (4 * (k + 1) + 1, 4 * (k + 1) + 9, 512):
        cfg = make_config(k, k or 1, max_num_seqs=4, budget=budget)
        eng = build_engine(cfg, target, mtp if k else None)
        outs.append(eng.generate([r.fresh_copy() for r in reqs]))
        eng.close()
    assert outs[0] == outs[1] == outs[2]
