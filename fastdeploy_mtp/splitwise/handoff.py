"""The per-slot state a prefill instance hands to a decode instance.

After the step that emits a request's first token, its slot holds everything the next
round needs besides the KV caches: the target's lengths, step counter, history, drafts and
sampling fields, and the proposer's shadow state (lengths, draft history, the n-gram
prompt copy). :func:`export_slot` reads one slot's rows of the buffers named in
:data:`TARGET_SLOT_BUFFERS` and :data:`DRAFT_SLOT_BUFFERS`; :func:`import_slot` writes them
into another slot of another engine. The block table is not part of it (the decode
instance allocates its own blocks); the hidden rows the MTP layer consumes next are not
either, because the decode instance's first verify forward recomputes them (a round's
MTP input is the target's hidden rows of *that* round's accepted tokens).

The state is JSON (it travels in HTTP bodies and ZMQ messages, never pickled), one encoded
row per buffer (:mod:`.slot_rows`). The functions here are the
:class:`~fastdeploy_mtp.runtime.collaborators.SlotHandover` the engine is built with (this module
is passed as it), and what serving signs and checks of a hand-over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle

from ..runtime.collaborators import HandoffError
from .slot_rows import check_values, decode_row, encode_row

#: Target (``share_inputs``) buffers with one row per slot that a handed-off slot carries.
TARGET_SLOT_BUFFERS = (
    "input_ids",
    "token_ids_all",
    "prompt_lens",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "step_idx",
    "stop_flags",
    "is_block_step",
    "draft_tokens",
    "accept_tokens",
    "accept_num",
    "actual_draft_token_num",
    "max_dec_len",
    "min_dec_len",
    "top_p",
    "top_k",
    "temperature",
    "infer_seed",
    "min_p",
    "penalty_score",
    "frequency_score",
    "presence_score",
    "bad_tokens",
    "bad_tokens_len",
    "reasoning_status",
)

#: The proposer's own (not shared with the target) per-slot buffers a handed-off slot carries.
DRAFT_SLOT_BUFFERS = (
    "input_ids",
    "token_ids_all",
    "seq_lens_this_time",
    "seq_lens_encoder",
    "seq_lens_decoder",
    "step_idx",
    "stop_flags",
    "draft_tokens",
    "pre_ids",
    "input_ids_cpu",
    "input_ids_len",
    "last_seq_lens_this_time",
    "is_block_step",
    "batch_drop",
    "used_list_len",
    "encoder_block_lens",
    "mask_rollback",
    "recompute_token_num",
)


def _row_views(buffers: Any, names: tuple[str, ...], idx: int) -> dict[str, paddle.Tensor]:
    return {name: buffers[name][idx] for name in names}


def export_slot(target: Any, draft: Any | None, idx: int) -> dict[str, Any]:
    """Slot ``idx``'s rows of the target's buffers ``target`` and (with speculation) the
    proposer's ``draft`` as JSON: ``{"target": {name: row}, "draft": {name: row} | None}``."""
    out: dict[str, Any] = {"target": {}, "draft": None}
    for name, row in _row_views(target, TARGET_SLOT_BUFFERS, idx).items():
        out["target"][name] = encode_row(row.numpy())
    if draft is not None:
        out["draft"] = {
            name: encode_row(row.numpy())
            for name, row in _row_views(draft, DRAFT_SLOT_BUFFERS, idx).items()
        }
    return out


def check_slot_state(
    state: object, target: Any, draft: Any | None, vocab_size: int | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """Decode and check ``state`` (from :func:`export_slot`) against this engine's buffers:
    every buffer present, rows of this engine's length and dtype, speculation on both sides
    or on neither, lengths in ``[0, max_model_len]`` and (given ``vocab_size``) token ids
    ``-1`` or in ``[0, vocab_size)``. Returns the decoded rows; raises
    :class:`HandoffError` naming the buffer."""
    if not isinstance(state, Mapping) or set(state) != {"target", "draft"}:
        raise HandoffError("slot state: expected an object with keys `target` and `draft`")
    if (state["draft"] is None) != (draft is None):
        theirs = "no" if state["draft"] is None else "a"
        ours = "no" if draft is None else "an"
        raise HandoffError(
            f"slot state: the prefill instance sent {theirs} MTP state, this instance runs "
            f"{ours} MTP layer"
        )
    decoded: dict[str, dict[str, np.ndarray]] = {}
    for part, buffers, names in (
        ("target", target, TARGET_SLOT_BUFFERS),
        ("draft", draft, DRAFT_SLOT_BUFFERS),
    ):
        if buffers is None:
            continue
        rows = state[part]
        if not isinstance(rows, Mapping) or set(rows) != set(names):
            missing = sorted(set(names) - set(rows)) if isinstance(rows, Mapping) else list(names)
            extra = sorted(set(rows) - set(names)) if isinstance(rows, Mapping) else []
            raise HandoffError(
                f"slot state `{part}`: buffers differ (missing {missing}, unexpected {extra})"
            )
        decoded[part] = {}
        for name in names:
            ref = buffers[name]
            shape = [int(s) for s in ref.shape[1:]]
            dtype = np.dtype(paddle.empty([0], dtype=ref.dtype).numpy().dtype)
            decoded[part][name] = decode_row(f"{part}.{name}", rows[name], shape, dtype)
            check_values(
                f"{part}.{name}",
                name,
                decoded[part][name],
                int(target.input_ids.shape[1]),
                vocab_size,
            )
    return decoded


def import_slot(state: object, target: Any, draft: Any | None, idx: int) -> None:
    """Write ``state`` (see :func:`export_slot`; checked by :func:`check_slot_state` first, so
    nothing is written when it does not fit) into slot ``idx`` of ``target`` and ``draft``."""
    decoded = check_slot_state(state, target, draft)
    for part, buffers in (("target", target), ("draft", draft)):
        if buffers is None:
            continue
        for name, row in decoded[part].items():
            buffers[name][idx] = paddle.to_tensor(row, dtype=buffers[name].dtype)


def slot_tokens(state: object) -> int:
    """Tokens the handed-over slot feeds in its first decode step (its target
    ``seq_lens_this_time``: the first token plus its drafts); 0 if ``state`` lacks it."""
    try:
        row = state["target"]["seq_lens_this_time"]  # type: ignore[index]
        values = row["v"] or [row["fill"]]
        return max(int(values[0]), 0)
    except (KeyError, TypeError, IndexError, ValueError):
        return 0


def first_drafts(state: object) -> list[int]:
    """The drafts a handed-over slot carries into its first verify round (its target
    ``draft_tokens`` row after the first token, placeholders dropped; FastDeploy's
    ``request.draft_token_ids``)."""
    try:
        row = state["target"]["draft_tokens"]  # type: ignore[index]
        values = list(row["v"]) + [row["fill"]] * (int(row["n"]) - len(row["v"]))
    except (KeyError, TypeError, ValueError):
        return []
    return [int(v) for v in values[1:] if int(v) >= 0]


#: Target buffers that hold a request's sampling parameters: buffer -> (SamplingParams
#: field, how the runner stores it).
_SAMPLING_ROWS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "penalty_score": "repetition_penalty",
    "frequency_score": "frequency_penalty",
    "presence_score": "presence_penalty",
}


def sampling_mismatch(state: object, sampling: Any, request_id: str, max_tokens: int) -> str | None:
    """``None`` if the handed-over slot ``state`` was loaded with ``sampling`` (a
    :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams`; its seed as the runner
    derives it for ``request_id``; its EOS mask length ``min_dec_len`` as it derives it for
    ``max_tokens``), else which field differs. Checked on the decode side so
    that its host-side view of the request (stops, logprobs, the sampler) and the slot agree."""
    try:
        target = state["target"]  # type: ignore[index]

        def first(name: str) -> Any:
            row = target[name]
            return (row["v"] or [row["fill"]])[0]

        def value(name: str) -> float:
            return float(first(name))

        for buffer, name in _SAMPLING_ROWS.items():
            theirs, ours = value(buffer), float(np.float32(getattr(sampling, name)))
            if theirs != ours:
                return f"{name}: the prefill instance has {theirs:g}, this request says {ours:g}"
        theirs_len, ours_len = int(first("min_dec_len")), sampling.eos_ban_len(max_tokens)
        if theirs_len != ours_len:
            return (
                f"min_tokens / ignore_eos: the prefill instance masks EOS for {theirs_len} tokens, "
                f"this request for {ours_len}"
            )
        if int(first("infer_seed")) != sampling.seed_for(request_id):
            return "seed: differs from the prefill instance's"
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        return f"the slot state has no readable sampling rows ({exc})"
    return None


# ---- what binds a hand-over to its request --------------------------------------------------


def signed_content(
    request_id: str, prompt_token_ids: list[int], output_token_ids: list[int], state: Any, kv: Any
) -> dict[str, Any]:
    """What a hand-over's signature covers: the request, its prompt and first tokens, the slot
    state and the KV descriptor (its transfer token included)."""
    return {
        "request_id": request_id,
        "prompt_token_ids": list(prompt_token_ids),
        "output_token_ids": list(output_token_ids),
        "state": state,
        "kv": kv,
    }


def sign_handoff(
    secret: bytes,
    request_id: str,
    prompt_token_ids: list[int],
    output_token_ids: list[int],
    state: Any,
    kv: Any,
) -> str:
    """The prefill instance's signature of a hand-over (HMAC-SHA256 under the key the
    splitwise secret derives for ``"handoff"``, hex)."""
    from ..credentials import derive, sign

    return sign(
        derive(secret, "handoff"),
        signed_content(request_id, prompt_token_ids, output_token_ids, state, kv),
    )


def handoff_signature_matches(
    secret: bytes,
    signature: Any,
    request_id: str,
    prompt_token_ids: list[int],
    output_token_ids: list[int],
    state: Any,
    kv: Any,
) -> bool:
    """Whether ``signature`` is :func:`sign_handoff` of these values (constant time)."""
    from ..credentials import derive, signature_matches

    content = signed_content(request_id, prompt_token_ids, output_token_ids, state, kv)
    return signature_matches(derive(secret, "handoff"), content, signature)


def _row(state: Any, part: str, name: str) -> list[Any]:
    """The full row ``name`` of ``state[part]`` (``check_slot_state`` accepted its encoding)."""
    enc = state[part][name]
    return list(enc["v"]) + [enc["fill"]] * (int(enc["n"]) - len(enc["v"]))


def _check_history_tokens(state: Any, prompt: list[int], outputs: list[int]) -> None:
    """The state's token history is ``prompt`` then ``outputs``, and the token it feeds next
    (``draft_tokens[0]``) is the last of ``outputs``."""
    history = [int(v) for v in _row(state, "target", "token_ids_all")]
    if history[: len(prompt)] != prompt:
        raise HandoffError(
            "slot state `target.token_ids_all` does not start with the request's prompt"
        )
    if history[len(prompt) : len(prompt) + len(outputs)] != outputs:
        raise HandoffError(
            "slot state `target.token_ids_all` does not continue with the request's first tokens"
        )
    if int(_row(state, "target", "draft_tokens")[0]) != outputs[-1]:
        raise HandoffError(
            "slot state `target.draft_tokens[0]` is not the request's last first token"
        )


def check_handoff_history(
    state: Any,
    prompt_token_ids: list[int],
    output_token_ids: list[int],
    num_offered_blocks: int,
    block_size: int,
    num_speculative_tokens: int,
) -> None:
    """Check that a hand-over's slot state (accepted by :func:`check_slot_state`) is the state
    of *this* request just after its prompt: the lengths, the step counter and the token
    history agree with the prompt and the first tokens the decode request carries, and the
    offered blocks hold every position the state says is cached. A state that is in range but
    inconsistent (say ``seq_lens_decoder`` 1000 for a 62-token prompt) would decode from
    positions nobody wrote; it is refused with :class:`HandoffError` naming the field.

    Args:
        state: the slot state (``{"target": ..., "draft": ...}``).
        prompt_token_ids, output_token_ids: the decode request's prompt and first tokens.
        num_offered_blocks: blocks the hand-over's KV descriptor offers.
        block_size: tokens per KV block.
        num_speculative_tokens: this instance's K (0 without speculation).
    """
    prompt, outputs = list(prompt_token_ids), list(output_token_ids)
    n_prompt, n_out, k = len(prompt), len(outputs), int(num_speculative_tokens)

    def one(part: str, name: str) -> int:
        return int(_row(state, part, name)[0])

    def expect(part: str, name: str, ok: bool, wanted: str) -> None:
        if not ok:
            raise HandoffError(
                f"slot state `{part}.{name}` is {one(part, name)}, expected {wanted} "
                f"(a {n_prompt}-token prompt with {n_out} first token(s))"
            )

    if not outputs:
        raise HandoffError("a hand-over comes with the first token(s): `output_token_ids` is empty")
    expect("target", "prompt_lens", one("target", "prompt_lens") == n_prompt, str(n_prompt))
    expect(
        "target",
        "seq_lens_encoder",
        one("target", "seq_lens_encoder") == 0,
        "0 (the prompt is done)",
    )
    expect(
        "target",
        "seq_lens_decoder",
        one("target", "seq_lens_decoder") == n_prompt,
        f"{n_prompt} (the prompt)",
    )
    expect("target", "step_idx", one("target", "step_idx") == n_out, f"{n_out} (the first tokens)")
    this_time = one("target", "seq_lens_this_time")
    expect("target", "seq_lens_this_time", 1 <= this_time <= k + 1, f"1..{k + 1}")
    expect("target", "stop_flags", not bool(_row(state, "target", "stop_flags")[0]), "false")
    _check_history_tokens(state, prompt, outputs)
    cached = n_prompt
    if state.get("draft") is not None:
        expect(
            "draft",
            "seq_lens_encoder",
            one("draft", "seq_lens_encoder") == 0,
            "0 (the prompt is done)",
        )
        draft_cached = one("draft", "seq_lens_decoder")
        expect("draft", "seq_lens_decoder", draft_cached <= n_prompt + k, f"at most {n_prompt + k}")
        expect(
            "draft",
            "input_ids_len",
            one("draft", "input_ids_len") <= n_prompt,
            f"at most {n_prompt}",
        )
        cached = max(cached, draft_cached)
    need = -(-cached // int(block_size))
    if num_offered_blocks < need:
        raise HandoffError(
            f"the hand-over offers {num_offered_blocks} KV block(s) of {block_size} tokens; "
            f"its state has {cached} cached positions, which need {need}"
        )
