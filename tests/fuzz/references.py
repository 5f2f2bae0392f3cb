"""Adapters from a fuzz case to each op's numpy reference (tests/reference/).

Each adapter takes the case's input tensors by name (copies), its attrs by name and the
caller-provided outputs, and returns the expected value of every tensor the op may change
(by name), in the form the framework-free module leaves them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.reference import (
    draft_model_postprocess as postprocess_ref,
    draft_model_preprocess as preprocess_ref,
    draft_model_update as update_ref,
    hidden_states,
    mtp_step_paddle as step_ref,
    ngram,
    speculate_get_logits as logits_ref,
    speculate_pre_process as pre_process_ref,
    unified_update_model_status as unified_ref,
    update_attn_mask_offsets as mask_ref,
    verify_draft_tokens as verify_ref,
)


def _positional(decl_inputs: tuple[str, ...], tensors: dict) -> list:
    return [tensors[name] for name in decl_inputs]


def _named(names: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """For references taking the op's tensors positionally in declaration order."""

    def wrap(fn: Callable) -> Callable:
        def adapter(tensors: dict, attrs: dict, outputs: dict) -> dict:
            return fn(*_positional(names, tensors), **attrs)

        return adapter

    return wrap


def _postprocess(tensors: dict, attrs: dict, outputs: dict) -> dict:
    return postprocess_ref.draft_model_postprocess(
        *_positional(
            (
                "base_model_draft_tokens",
                "base_model_seq_lens_this_time",
                "base_model_seq_lens_encoder",
                "base_model_stop_flags",
            ),
            tensors,
        )
    )


def _logits(tensors: dict, attrs: dict, outputs: dict) -> dict:
    names = (
        "draft_logits", "next_token_num", "batch_token_num", "cu_next_token_offset", "cu_batch_token_offset",
        "logits", "first_token_logits", "seq_lens_this_time", "seq_lens_encoder",
    )  # fmt: skip
    return logits_ref.speculate_get_logits(*_positional(names, tensors))


def _rows(fn: Callable, names: tuple[str, ...], attr_names: tuple[str, ...] = ()) -> Callable:
    def adapter(tensors: dict, attrs: dict, outputs: dict) -> dict:
        out, count = fn(*_positional(names, tensors), *[attrs[a] for a in attr_names])
        return {"out": out, "output_token_num": count}

    return adapter


def _ngram(fn: Callable, names: tuple[str, ...], attr_names: tuple[str, ...]) -> Callable:
    def adapter(tensors: dict, attrs: dict, outputs: dict) -> dict:
        return fn(*_positional(names, tensors), *[attrs[a] for a in attr_names])

    return adapter


def _verify(tensors: dict, attrs: dict, outputs: dict) -> dict:
    attr_order = ("max_seq_len", "verify_window", "verify_strategy", "reject_all", "accept_all")
    return verify_ref.verify_draft_tokens(_positional(verify_ref.NAMES, tensors), [attrs[a] for a in attr_order])


def _unified(tensors: dict, attrs: dict, outputs: dict) -> dict:
    return unified_ref.unified_update_model_status(_positional(unified_ref.NAMES, tensors))


def _pre_process(tensors: dict, attrs: dict, outputs: dict) -> dict:
    return pre_process_ref.speculate_pre_process(
        *_positional(pre_process_ref.INPUTS, tensors), cpu_token_num=attrs["cpu_token_num"]
    )


def _mask(tensors: dict, attrs: dict, outputs: dict) -> dict:
    names = (
        "ids_remove_padding", "seq_lens_this_time", "seq_lens_encoder", "seq_lens_decoder", "cu_seqlens_q",
        "attn_mask_offsets_full", "is_block_step", "decode_states",
    )  # fmt: skip
    out, states = mask_ref.update_attn_mask_offsets(*_positional(names, tensors))
    return {"attn_mask_offsets": out, "decode_states": states}


REFERENCES: dict[str, Callable] = {
    "verify_draft_tokens": _verify,
    "unified_update_model_status": _unified,
    "speculate_pre_process": _pre_process,
    "update_attn_mask_offsets": _mask,
    "draft_model_postprocess": _postprocess,
    "draft_model_preprocess": _named(preprocess_ref.NAMES)(preprocess_ref.draft_model_preprocess),
    "draft_model_update": _named(update_ref.NAMES)(update_ref.draft_model_update),
    "mtp_step_paddle": _named(step_ref.NAMES)(step_ref.mtp_step_paddle),
    "speculate_get_logits": _logits,
    "eagle_get_hidden_states": _rows(
        hidden_states.eagle_get_hidden_states,
        (
            "input",
            "seq_lens_this_time",
            "seq_lens_encoder",
            "seq_lens_decoder",
            "stop_flags",
            "accept_nums",
            "base_model_seq_lens_this_time",
            "base_model_seq_lens_encoder",
        ),
        ("actual_draft_token_num",),
    ),  # fmt: skip
    "eagle_get_self_hidden_states": _rows(
        hidden_states.eagle_get_self_hidden_states,
        ("input", "last_seq_lens_this_time", "seq_lens_this_time", "seq_lens_encoder"),
    ),
    "eagle_gather_hidden_states": _rows(
        hidden_states.eagle_gather_hidden_states,
        (
            "input",
            "cu_seqlens_q",
            "seq_lens_this_time",
            "seq_lens_decoder",
            "seq_lens_encoder",
            "batch_id_per_token_output",
            "cu_seqlens_q_output",
            "real_output_token_num",
        ),
    ),  # fmt: skip
    "hybrid_mtp_ngram": _ngram(
        ngram.hybrid_mtp_ngram,
        (
            "input_ids",
            "input_ids_len",
            "pre_ids",
            "step_idx",
            "draft_token_num",
            "draft_tokens",
            "seq_lens_this_time",
            "seq_lens_decoder",
            "max_dec_len",
        ),
        ("max_ngram_size", "min_ngram_size", "max_draft_tokens", "threshold"),
    ),  # fmt: skip
    "ngram_match": _ngram(
        ngram.ngram_match,
        (
            "input_ids",
            "input_ids_len",
            "token_ids_all",
            "prompt_lens",
            "step_idx",
            "draft_token_num",
            "draft_tokens",
            "seq_lens_this_time",
            "seq_lens_encoder",
            "seq_lens_decoder",
            "max_dec_len",
        ),
        ("max_ngram_size", "max_draft_tokens", "threshold"),
    ),  # fmt: skip
}


def _bits(a) -> bytes:
    return np.ascontiguousarray(np.asarray(a)).tobytes()


def compare_with_reference(op: str, tensors: dict, attrs: dict, outputs: dict, results: dict) -> None:
    """Asserts that the op's results equal its reference (bit for bit) on copies of the inputs."""
    copies = {k: None if v is None else np.array(v, copy=True) for k, v in tensors.items()}
    want = REFERENCES[op](copies, attrs, outputs)
    for name, value in want.items():
        if name not in results or value is None:
            continue
        got = np.asarray(results[name])
        value = np.asarray(value)
        assert got.shape == value.shape and _bits(got) == _bits(value.astype(got.dtype)), (
            f"{op}: `{name}` differs from the reference:\n got  {got.reshape(-1)[:16]}\n want {value.reshape(-1)[:16]}"
        )
