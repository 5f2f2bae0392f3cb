"""One proposer round under the draft planner (:mod:`.draft_planner`): the model-free
candidates of the round, the plan, the MTP layer run or skipped, and each slot's drafts taken
from its method's candidates and cut to its count, written into the target's buffers."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import paddle

from .collaborators import Proposer
from .draft_methods import METHODS
from .draft_planner import DraftPlanner
from .spec_step import StepBackend, postprocess
from .step_output import StepOutput

MTP = METHODS.index("mtp")


def planned_round(
    planner: DraftPlanner,
    proposer: Proposer,
    target: Any,
    hidden: paddle.Tensor,
    out: StepOutput,
    still: np.ndarray,
    prefill: bool,
    rows_start: np.ndarray,
    real_bsz: int,
    be: StepBackend,
    forced: dict[int, list[int]],
) -> None:
    """Plan and run the round after step ``out``.

    Args:
        planner: the runner's planner.
        proposer: the MTP proposer (its ``alternatives`` give the model-free candidates, when
            the deployment offers them).
        target: the target runner's ``share_inputs`` (``draft_tokens [N, K+1]`` int64 and
            ``seq_lens_this_time [N]`` int32 are rewritten).
        hidden: ``[T, H]`` the target's hidden rows of this step.
        out: what the step emitted (host arrays).
        still: ``[N]`` slots that decode next step.
        prefill: some slot was in prefill this step.
        rows_start: ``[N]`` each slot's first row in ``hidden``.
        real_bsz: leading slots in use (the MTP round's batch).
        be: how the ops run (``draft_model_postprocess`` recounts the slots' tokens).
        forced: per constrained slot, the tokens its grammar forces next (the runner puts them
            ahead of the drafts after this round; the plan counts them as certain and free of
            any MTP substep).
    """
    planner.observe(out.accept_tokens, out.accept_num, out.decode_mask)
    alternatives = proposer.alternatives
    wanted, t0 = planner.wants_candidates(), time.perf_counter()
    candidates = alternatives.candidates(wanted) if alternatives else {}
    if wanted is not None:
        planner.scoring.note(time.perf_counter() - t0)
    counts = np.zeros(still.shape[0], np.int64)
    for idx, tokens in forced.items():
        counts[idx] = len(tokens)
    # a prefill round runs the MTP layer only for a request it sees
    prefill = prefill and bool((still & ~out.decode_mask & ~planner.no_mtp).any())
    plan = planner.plan_round(still, prefill, candidates, counts)
    if plan.steps == 0:
        proposer.skip_round(hidden, out, rows_start)
        if not plan.limits.any():  # plain decoding: skip_round left every row empty
            planner.compose(plan, candidates)  # (the candidates are still scored next step)
            return
    else:
        proposer.run(hidden, real_bsz=real_bsz, num_steps=plan.steps)
        candidates[MTP] = be.host(target.draft_tokens)[:, 1:].copy()
    rows = planner.compose(plan, candidates)
    target.draft_tokens[:, 1:] = paddle.to_tensor(rows)
    postprocess(be, target)
