"""The op sequences of one speculative step, written once against a small backend seam.

Both the reference engine (:class:`~fastdeploy_mtp.runtime.target_runner.TargetRunner` and
:class:`~fastdeploy_mtp.proposer.MTPProposer`, on Paddle tensors) and the framework-free
end-to-end check (``tests/e2e/framework_free.py``: ``fastdeploy_mtp._kernels`` on numpy,
the CUDA and XPU emulators, torch or CuPy tensors) run the functions here, so the two cannot
drift apart:

* :func:`target_step`: ``speculate_pre_process`` -> target forward -> logit rows -> target
  tokens -> ``verify_draft_tokens`` -> the model's rollback of recurrent state
  (``commit_verified``) -> ``unified_update_model_status``;
* the proposer's round: :func:`prepare_round` (``draft_model_preprocess`` ->
  ``eagle_get_hidden_states`` -> staging), :func:`propose_substeps` (per substep
  ``speculate_pre_process`` -> MTP forward -> ``eagle_gather_hidden_states`` -> sampling ->
  ``draft_model_update`` -> staging) and :func:`postprocess` (``draft_model_postprocess``).

What differs between the two is behind two seams: a :class:`StepBackend` (how an op is called
on the buffers, how a buffer is read on the host, how rows are staged) and the models
(:class:`TargetStepModel`, :class:`DraftStepModel`: forwards, logits, sampling). Buffers are
passed as the namespaces of the callers (``share_inputs`` and the proposer's
``model_inputs``, or stand-ins with the same attribute names); the functions read the
attributes FastDeploy's names give them.

This module imports no framework: :class:`PaddleBackend` only calls methods of the tensors
it is given and the ops of :mod:`fastdeploy_mtp.ops`, which import Paddle on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .. import ops


class StepBackend(Protocol):
    """Where the step's buffers live and how an op runs on them."""

    def host(self, arr: Any) -> np.ndarray:
        """A host (numpy) view or copy of ``arr``; the caller copies before the next op."""
        ...

    def float32(self, arr: Any) -> Any:
        """``arr`` as float32 (the hidden rows the proposer's ops take)."""
        ...

    def stage(self, dst: Any, src: Any) -> None:
        """``dst[:R] = src`` for ``src`` of ``R`` rows (the proposer's hidden-row staging)."""
        ...

    def run_op(self, name: str, **kwargs: Any) -> Any:
        """Op ``name`` of :mod:`fastdeploy_mtp.ops` with these keyword arguments (the
        wrappers' names); returns what the op's wrapper returns (its new outputs, or None)."""
        ...


class PaddleBackend:
    """Paddle tensors, ops through :mod:`fastdeploy_mtp.ops`'s wrappers."""

    def host(self, arr: Any) -> np.ndarray:
        return arr.numpy()

    def float32(self, arr: Any) -> Any:
        return arr.astype("float32")

    def stage(self, dst: Any, src: Any) -> None:
        dst[: int(src.shape[0])] = src

    def run_op(self, name: str, **kwargs: Any) -> Any:
        return getattr(ops, name)(**kwargs)


#: the lengths most ops take, under these names
_LENS = ("seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder")
#: the draft's per-slot state the round's draft ops update in place
_DRAFT_STATE = ("draft_tokens", "pre_ids", "step_idx", "stop_flags", "not_need_stop")


def _named(side: Any, *names: str, prefix: str = "") -> dict[str, Any]:
    """Buffers of ``side`` as keyword arguments of the same names, after ``prefix`` (the ops
    take FastDeploy's buffer names; the draft ops name the target's ``target_model_*`` or
    ``base_model_*``)."""
    return {prefix + name: getattr(side, name) for name in names}


def _step_io(target: Any) -> dict[str, Any]:
    """The target's drafts in and tokens out, as verification and the status update name them."""
    return {
        "step_input_ids": target.draft_tokens,
        "step_output_ids": target.accept_tokens,
        "step_output_len": target.accept_num,
    }


@dataclass
class Packed:
    """``speculate_pre_process``'s outputs (``T`` = the token count it was given, ``N``
    slots, ``W = K + 1``): ``ids_remove_padding`` ``[T]`` int64, ``batch_id_per_token``
    ``[T]`` int32, ``cu_seqlens_q`` / ``cu_seqlens_k`` / ``cu_seqlens_q_output`` ``[N + 1]``
    int32, ``batch_id_per_token_output`` ``[N * W]`` int32, ``real_output_token_num`` ``[1]``
    int32."""

    ids_remove_padding: Any
    batch_id_per_token: Any
    cu_seqlens_q: Any
    cu_seqlens_k: Any
    cu_seqlens_q_output: Any
    batch_id_per_token_output: Any
    real_output_token_num: Any


def pack_tokens(be: StepBackend, token_num: int, side: Any) -> Packed:
    """``speculate_pre_process`` over one side's buffers (the target's or the draft's)."""
    return Packed(
        *be.run_op(
            "speculate_pre_process",
            cpu_token_num=token_num,
            seq_len=side.seq_lens_this_time,
            **_named(side, "input_ids", "draft_tokens", "seq_lens_encoder", "seq_lens_decoder"),
        )
    )


@dataclass
class LogitRows:
    """The target rows that get logits, in batch order: the last token of a prefill chunk
    (or of a 1-token item), every token of a decode item with drafts (the output-row rule of
    ``speculate_pre_process``).

    Attributes:
        rows: ``R`` row indices into the forward's packed rows.
        slots: ``[R]`` int64, the slot of each row.
        positions: ``[R]`` int64, each row's index among its slot's rows.
        cu: ``[N + 1]`` int64 prefix sums of ``seq_lens_this_time`` (each slot's first row).
    """

    rows: list[int]
    slots: np.ndarray
    positions: np.ndarray
    cu: np.ndarray


def logit_rows(slt: np.ndarray, enc: np.ndarray) -> LogitRows:
    """:class:`LogitRows` from this step's host ``seq_lens_this_time`` and ``seq_lens_encoder``
    (``[N]`` int64 each)."""
    cu = np.concatenate([[0], np.cumsum(slt)])
    rows: list[int] = []
    slots: list[int] = []
    positions: list[int] = []
    for b in np.nonzero(slt)[0]:
        n, s = int(slt[b]), int(cu[b])
        span = [s + n - 1] if (n == 1 or enc[b] != 0) else list(range(s, s + n))
        rows.extend(span)
        slots.extend([int(b)] * len(span))
        positions.extend(range(len(span)))
    return LogitRows(rows, np.asarray(slots, np.int64), np.asarray(positions, np.int64), cu)


class TargetStepModel(Protocol):
    """The target side of :func:`target_step`."""

    def forward_target(self, packed: Packed, slt: np.ndarray, enc: np.ndarray) -> Any:
        """``[T, H]`` hidden rows of the packed tokens (``slt``/``enc``: host lengths)."""
        ...

    def target_tokens(self, hidden: Any, rows: LogitRows) -> tuple[Any, Any]:
        """``([R] int64 target tokens, the sampler's extras or None)``; the extras carry
        ``candidate_ids``, ``candidate_scores``, ``candidate_lens`` and ``uniforms``."""
        ...

    def commit_verified(self, accept_num: Any, verified: np.ndarray) -> None:
        """Verification has run: ``accept_num [N]`` (the backend's array) tokens were accepted
        in each slot of ``verified [N]`` (bool, host; the slots that decoded). A model whose
        layers keep a recurrent state rolls each verified slot back to the state after its
        accepted tokens (:class:`~fastdeploy_mtp.models.linear_state.LinearStates`); others
        do nothing."""
        ...


@dataclass
class TargetStep:
    """What :func:`target_step` leaves on the host (and the forward's hidden rows).

    Attributes:
        slt, enc: ``[N]`` int64, ``seq_lens_this_time`` / ``seq_lens_encoder`` before the step.
        token_num: tokens in the forward.
        hidden: ``[T, H]`` the target's hidden rows (backend array).
        rows: the logit rows.
        drafts: ``[N, K]`` the drafts verified this step (-1 = none).
        decode_mask: ``[N]`` slots that decoded (not prefill).
        sampled: the sampler's extras (None for argmax).
    """

    slt: np.ndarray
    enc: np.ndarray
    token_num: int
    hidden: Any
    rows: LogitRows
    drafts: np.ndarray
    decode_mask: np.ndarray
    sampled: Any


def target_step(
    be: StepBackend, target: Any, model: TargetStepModel, max_seq_len: int, verify_strategy: int
) -> TargetStep:
    """One target step over ``target`` (the runner's ``share_inputs``): pack, forward, the
    target's tokens, verification and the status update. Reads back only the lengths and the
    drafts it verifies."""
    slt = be.host(target.seq_lens_this_time).astype(np.int64)
    enc = be.host(target.seq_lens_encoder).astype(np.int64)
    token_num = int(slt.sum())
    packed = pack_tokens(be, token_num, target)
    hidden = model.forward_target(packed, slt, enc)
    rows = logit_rows(slt, enc)
    target_tokens, sampled = model.target_tokens(hidden, rows)
    drafts = be.host(target.draft_tokens)[:, 1:].copy()
    be.run_op(
        "verify_draft_tokens",
        **_step_io(target),
        target_tokens=target_tokens,
        candidate_ids=sampled.candidate_ids if sampled is not None else None,
        candidate_scores=sampled.candidate_scores if sampled is not None else None,
        candidate_lens=sampled.candidate_lens if sampled is not None else None,
        topp=target.top_p,
        end_tokens=target.eos_token_id,
        cu_seqlens_q_output=packed.cu_seqlens_q_output,
        **_named(
            target,
            "seq_lens_encoder",
            "seq_lens_this_time",
            "stop_flags",
            "is_block_step",
            "step_idx",
        ),
        **_named(target, "reasoning_status", "max_dec_len"),
        verify_uniforms=sampled.uniforms if sampled is not None else None,
        max_seq_len=max_seq_len,
        verify_strategy=verify_strategy,
        # the token reaching max_tokens is the one the strategy chose (upstream emits
        # eos_token_id[0] there, dropping the request's last real token)
        keep_max_dec_len_token=True,
    )
    decoded = (slt > 0) & (enc == 0)
    model.commit_verified(target.accept_num, decoded)
    _update_status(be, target)
    return TargetStep(slt, enc, token_num, hidden, rows, drafts, decoded, sampled)


def _update_status(be: StepBackend, target: Any) -> None:
    be.run_op(
        "unified_update_model_status",
        **_step_io(target),
        has_running_seqs=target.not_need_stop,
        is_paused=target.is_block_step,
        end_tokens=target.eos_token_id,
        **_named(
            target, *_LENS, "stop_flags", "token_ids_all", "prompt_lens", "step_idx", "max_dec_len"
        ),
        keep_max_dec_len_token=True,
    )


class DraftStepModel(Protocol):
    """The MTP side of :func:`propose_substeps`."""

    def forward_substep(self, substep: int, packed: Packed, token_num: int) -> Any:
        """``[token_num, H]`` output rows of the MTP layer over the packed draft tokens and
        the first ``token_num`` staged hidden rows (``target_hidden_states``)."""
        ...

    def sample_substep(self, gathered: Any, substep: int) -> Any:
        """``[N]`` int64 drafts from the gathered rows (one per active item, compacted)."""
        ...

    def empty_substep(self) -> None:
        """A substep with no token to feed (FastDeploy's ``empty_input_forward``)."""
        ...


def prepare_round(
    be: StepBackend,
    draft: Any,
    target: Any,
    hidden: Any,
    num_model_steps: int,
    is_splitwise_prefill: bool,
) -> None:
    """Start the proposer's round: ``draft_model_preprocess`` sets the draft's state from the
    target's verified state; ``eagle_get_hidden_states`` picks the target's hidden rows
    (``hidden`` ``[T, H]``) the MTP layer consumes, staged in ``draft.target_hidden_states``.

    Raises:
        ValueError: more rows than the staging buffer holds.
    """
    be.run_op(
        "draft_model_preprocess",
        **_named(
            draft, *_LENS, *_DRAFT_STATE, "input_ids", "accept_tokens", "accept_num", "max_dec_len"
        ),
        **_named(
            target,
            "seq_lens_encoder",
            "seq_lens_decoder",
            "step_idx",
            "stop_flags",
            prefix="target_model_",
        ),
        target_model_draft_tokens=draft.base_model_draft_tokens,
        num_model_step=num_model_steps,
        is_splitwise_prefill=is_splitwise_prefill,
    )
    selected, _ = be.run_op(
        "eagle_get_hidden_states",
        input=be.float32(hidden),
        **_named(draft, *_LENS, "stop_flags"),
        accept_nums=draft.accept_num,
        **_named(target, "seq_lens_this_time", "seq_lens_encoder", prefix="base_model_"),
        actual_draft_token_num=num_model_steps,
    )
    rows, capacity = int(selected.shape[0]), int(draft.target_hidden_states.shape[0])
    if rows > capacity:
        raise ValueError(
            f"{rows} target hidden rows exceed the staging buffer ({capacity} rows): raise "
            "scheduler_config.max_num_batched_tokens"
        )
    if rows:
        be.stage(draft.target_hidden_states, selected)


def propose_substeps(
    be: StepBackend,
    draft: Any,
    model: DraftStepModel,
    real_bsz: int,
    target_rows: int,
    steps: int,
    max_seq_len: int,
) -> None:
    """``steps`` MTP substeps over ``draft`` (the proposer's ``model_inputs``). Token counts
    are host-known upper bounds, never read back: at substep 0 a slot feeds at most as many
    rows as the target fed this step, so ``target_rows`` bounds the total; afterwards each
    running slot feeds one row, so ``min(real_bsz, target_rows)`` does. Rows past the real
    count are padding the model ignores."""
    for substep in range(steps):
        draft.substep = substep
        token_num = target_rows if substep == 0 else min(real_bsz, target_rows)
        if token_num == 0:
            model.empty_substep()
            continue
        packed = pack_tokens(be, token_num, draft)
        hidden = model.forward_substep(substep, packed, token_num)
        gathered, _ = be.run_op(
            "eagle_gather_hidden_states",
            input=hidden,
            cu_seqlens_q=packed.cu_seqlens_q,
            **_named(draft, *_LENS),
            batch_id_per_token_output=packed.batch_id_per_token_output,
            cu_seqlens_q_output=packed.cu_seqlens_q_output,
            real_output_token_num=packed.real_output_token_num,
        )
        be.run_op(
            "draft_model_update",
            inter_next_tokens=model.sample_substep(gathered, substep),
            cu_seqlens_q_output=packed.cu_seqlens_q_output,
            **_named(draft, *_LENS, *_DRAFT_STATE, "max_dec_len"),
            end_ids=draft.eos_token_id,
            base_model_draft_tokens=draft.base_model_draft_tokens,
            max_seq_len=max_seq_len,
            substep=substep,
        )
        be.stage(draft.target_hidden_states, gathered)


def postprocess(be: StepBackend, target: Any) -> None:
    """``draft_model_postprocess``: each target item's token count for its next forward (a
    decoding item feeds the non-empty slots of its ``draft_tokens`` row, a stopped item 0;
    prefill items keep theirs)."""
    be.run_op(
        "draft_model_postprocess",
        **_named(
            target,
            "draft_tokens",
            "seq_lens_this_time",
            "seq_lens_encoder",
            "stop_flags",
            prefix="base_model_",
        ),
    )
