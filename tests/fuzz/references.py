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
    speculate_get_token_penalty_multi_scores as penalty_ref,
    speculate_pre_process as pre_process_ref,
    unified_update_model_status as unified_ref,
    update_attn_mask_offsets as mask_ref,
    verify_draft_tokens as verify_ref,
)


def _positional(decl_inputs: tuple[str, ...], tensors: dict) -> list:
    return [tensors[name] for name in decl_inputs]


def _inputs(op: str) -> tuple[str, ...]:
    """The op's tensor inputs in declaration order (the references take them in that order)."""
    from fastdeploy_mtp.ops import OP_SIGNATURES

    return OP_SIGNATURES[op][0]


def _named(names: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """For references taking the op's tensors positionally in declaration order."""

    def wrap(fn: Callable) -> Callable:
        def adapter(tensors: dict, attrs: dict, outputs: dict) -> dict:
            return fn(*_positional(names, tensors), **attrs)

        return adapter

    return wrap


def _postprocess(tensors: dict, attrs: dict, outputs: dict) -> dict:
    return postprocess_ref.draft_model_postprocess(
        *_positional(_inputs("draft_model_postprocess"), tensors)
    )


def _logits(tensors: dict, attrs: dict, outputs: dict) -> dict:
    return logits_ref.speculate_get_logits(*_positional(_inputs("speculate_get_logits"), tensors))


def _penalty(tensors: dict, attrs: dict, outputs: dict) -> dict:
    op = "speculate_get_token_penalty_multi_scores"
    return penalty_ref.speculate_get_token_penalty_multi_scores(*_positional(_inputs(op), tensors))


def _rows(op: str, fn: Callable) -> Callable:
    def adapter(tensors: dict, attrs: dict, outputs: dict) -> dict:
        out, count = fn(*_positional(_inputs(op), tensors), *attrs.values())
        return {"out": out, "output_token_num": count}

    return adapter


def _ngram(op: str, fn: Callable) -> Callable:
    def adapter(tensors: dict, attrs: dict, outputs: dict) -> dict:
        # the references take the attrs before num_threads, in declaration order
        return fn(
            *_positional(_inputs(op), tensors), *[v for k, v in attrs.items() if k != "num_threads"]
        )

    return adapter


def _verify(tensors: dict, attrs: dict, outputs: dict) -> dict:
    # attrs arrive in declaration order: max_seq_len, verify_window, verify_strategy, ...
    return verify_ref.verify_draft_tokens(
        _positional(verify_ref.NAMES, tensors), list(attrs.values())
    )


def _unified(tensors: dict, attrs: dict, outputs: dict) -> dict:
    return unified_ref.unified_update_model_status(_positional(unified_ref.NAMES, tensors), **attrs)


def _pre_process(tensors: dict, attrs: dict, outputs: dict) -> dict:
    return pre_process_ref.speculate_pre_process(
        *_positional(pre_process_ref.INPUTS, tensors), cpu_token_num=attrs["cpu_token_num"]
    )


def _mask(tensors: dict, attrs: dict, outputs: dict) -> dict:
    out, states = mask_ref.update_attn_mask_offsets(
        *_positional(_inputs("update_attn_mask_offsets"), tensors)
    )
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
    "speculate_get_token_penalty_multi_scores": _penalty,
    "eagle_get_hidden_states": _rows(
        "eagle_get_hidden_states", hidden_states.eagle_get_hidden_states
    ),
    "eagle_get_self_hidden_states": _rows(
        "eagle_get_self_hidden_states", hidden_states.eagle_get_self_hidden_states
    ),
    "eagle_gather_hidden_states": _rows(
        "eagle_gather_hidden_states", hidden_states.eagle_gather_hidden_states
    ),
    "hybrid_mtp_ngram": _ngram("hybrid_mtp_ngram", ngram.hybrid_mtp_ngram),
    "ngram_match": _ngram("ngram_match", ngram.ngram_match),
}


def _bits(a) -> bytes:
    return np.ascontiguousarray(np.asarray(a)).tobytes()


def compare_with_reference(
    op: str, tensors: dict, attrs: dict, outputs: dict, results: dict
) -> None:
    """Asserts that the op's results equal its reference (bit for bit) on copies of the inputs."""
    copies = {k: None if v is None else np.array(v, copy=True) for k, v in tensors.items()}
    want = REFERENCES[op](copies, attrs, outputs)
    for name, value in want.items():
        if name not in results or value is None:
            continue
        got = np.asarray(results[name])
        value = np.asarray(value)
        # outputs checked by element count accept any shape of that count: compare elements
        assert got.size == value.size and _bits(got.reshape(-1)) == _bits(
            value.astype(got.dtype).reshape(-1)
        ), (
            f"{op}: `{name}` differs from the reference:\n got  {got.reshape(-1)[:16]}\n"
            f" want {value.reshape(-1)[:16]}"
        )
