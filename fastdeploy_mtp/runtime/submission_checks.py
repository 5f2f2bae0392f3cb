"""The checks a request passes when it is submitted to the reference engine: a fresh
request with a unique id, a valid prompt, counts and sampling parameters, and a length and
worst-case KV footprint the engine can hold. Each raises
:class:`~fastdeploy_mtp.runtime.request.InvalidRequestError` (a ``ValueError`` naming the
request and the field); :meth:`~fastdeploy_mtp.runtime.scheduler.Scheduler.validate` runs
them in order."""

from __future__ import annotations

import numbers
from collections.abc import Container, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..constants import NO_SLOT
from .request import InvalidRequestError, Request, check_token_ids
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from ..config import SpeculativeConfig


def check_fresh(
    req: Request, running: Iterable[str], queued: Iterable[str], held: Container[str]
) -> None:
    """``req`` has a ``str`` id no ``running``, ``queued`` or ``held`` request has, and was
    never submitted (a handed-over request alone comes with output tokens)."""
    rid = req.request_id
    if not isinstance(rid, str):
        raise InvalidRequestError(rid, "request_id", f"must be a str, got {type(rid).__name__}")
    transferred = req.handoff_state is not None
    if (
        req.submitted
        or req.finished
        or (req.output_token_ids and not transferred)
        or req.idx != NO_SLOT
    ):
        raise InvalidRequestError(
            rid,
            "request",
            f"was already submitted (finished={req.finished}, {len(req.output_token_ids)} "
            "generated tokens): a Request is used once; submit `req.fresh_copy()` to run it "
            "again",
        )
    if rid in running:
        raise InvalidRequestError(rid, "request_id", "duplicates a request that is still running")
    if rid in queued:
        raise InvalidRequestError(rid, "request_id", "duplicates a request that is still queued")
    if rid in held:
        raise InvalidRequestError(
            rid, "request_id", "duplicates a request whose KV blocks are still held"
        )


def check_prompt(req: Request, vocab_size: int) -> None:
    """``prompt_token_ids`` is a non-empty flat sequence of ids in ``[0, vocab_size)``."""
    rid, prompt = req.request_id, req.prompt_token_ids
    if isinstance(prompt, (str, bytes)) or not isinstance(prompt, (Sequence, np.ndarray)):
        raise InvalidRequestError(
            rid,
            "prompt_token_ids",
            f"must be a sequence of token ids, got {type(prompt).__name__}",
        )
    if len(prompt) == 0:
        raise InvalidRequestError(rid, "prompt_token_ids", "is empty")
    check_token_ids(rid, prompt, vocab_size)


def check_counts(req: Request) -> None:
    """``max_tokens`` and ``arrival_step`` are integers (not bools), ``max_tokens > 0``;
    ``cache_namespace`` is ``bytes``."""
    if not isinstance(req.cache_namespace, bytes):
        raise InvalidRequestError(
            req.request_id,
            "cache_namespace",
            f"must be bytes, got a {type(req.cache_namespace).__name__}",
        )
    for name in ("max_tokens", "arrival_step"):
        value = getattr(req, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InvalidRequestError(req.request_id, name, f"must be an integer, got {value!r}")
    if req.max_tokens <= 0:
        raise InvalidRequestError(
            req.request_id, "max_tokens", f"must be > 0, got {req.max_tokens}"
        )


def check_handed_over_output(req: Request, vocab_size: int) -> None:
    """A handed-over request carries the prefill instance's first token(s), valid ids,
    fewer than ``max_tokens``."""
    rid, out = req.request_id, req.output_token_ids
    if not isinstance(out, list) or not out:
        raise InvalidRequestError(
            rid, "output_token_ids", "must hold the prefill instance's first token(s)"
        )
    check_token_ids(rid, out, vocab_size)
    if len(out) >= req.max_tokens:
        raise InvalidRequestError(
            rid,
            "output_token_ids",
            f"holds {len(out)} tokens: nothing left to decode (max_tokens {req.max_tokens})",
        )


def check_sampling(req: Request, spec: SpeculativeConfig) -> None:
    """``sampling`` is a valid :class:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams`
    that the verify strategy of ``spec`` serves."""
    rid, sampling = req.request_id, req.sampling
    if not isinstance(sampling, SamplingParams):
        raise InvalidRequestError(
            rid, "sampling", f"must be a SamplingParams, got {type(sampling).__name__}"
        )
    problem = sampling.check()
    if problem is not None:
        name, _, why = problem.partition(": ")
        raise InvalidRequestError(rid, name, why)
    if spec.enabled and spec.verify_strategy == "greedy" and not sampling.greedy:
        raise InvalidRequestError(
            rid,
            "temperature",
            f"= {sampling.temperature}: speculative_config.verify_strategy is 'greedy', which "
            "serves greedy requests only (use 'target_match' or 'rejection' to sample)",
        )
    pin = sampling.speculative_method
    if pin is not None and not _serves_pin(pin, spec):
        offered = (
            "no speculation"
            if not spec.enabled
            else f"only {spec.method!r} (per-request methods need adaptive_draft_length with "
            "verify_strategy 'target_match' or 'greedy')"
        )
        raise InvalidRequestError(
            rid, "speculative_method", f"{pin!r}: this engine offers {offered}"
        )


def check_arrival(req: Request, max_arrival_step: int | None) -> None:
    """``arrival_step`` is in ``[0, max_arrival_step)``."""
    if req.arrival_step < 0:
        raise InvalidRequestError(
            req.request_id, "arrival_step", f"must be >= 0, got {req.arrival_step}"
        )
    if max_arrival_step is not None and req.arrival_step >= max_arrival_step:
        raise InvalidRequestError(
            req.request_id,
            "arrival_step",
            f"= {req.arrival_step} is not below `max_steps` ({max_arrival_step})",
        )


def check_fits(
    req: Request,
    k: int,
    positions: tuple[int, int | None],
    blocks: int,
    block_limits: tuple[int, int],
) -> None:
    """Prompt + ``max_tokens`` + ``k`` + 1 positions fit ``positions`` (``max_model_len``, the
    model's positions or ``None``); the worst-case KV ``blocks`` fit ``block_limits`` (a
    slot's block table, the whole cache)."""
    rid, prompt = req.request_id, req.prompt_token_ids
    need = len(prompt) + int(req.max_tokens) + k + 1
    for limit, what in zip(positions, ("max_model_len", "the model's max positions")):
        if limit is not None and need > limit:
            raise InvalidRequestError(
                rid,
                "prompt_token_ids" if len(prompt) + k + 2 > limit else "max_tokens",
                f"too long: prompt ({len(prompt)}) + max_tokens ({req.max_tokens}) + K + 1 = "
                f"{need} exceeds {what} ({limit})",
            )
    for block_limit, what in zip(
        block_limits,
        (
            "a slot's block table (max_blocks_per_seq)",
            "the whole KV cache (cache_config.total_block_num)",
        ),
    ):
        if blocks > block_limit:
            raise InvalidRequestError(
                rid,
                "max_tokens",
                f"too large: the request may need {blocks} KV blocks, more than {what} = "
                f"{block_limit}",
            )


def _serves_pin(pin: str, spec: SpeculativeConfig) -> bool:
    """Whether an engine of ``spec`` can hold a request to drafting method ``pin``: its own
    method, any with the planner's per-request methods, "none" with the planner or without
    speculation."""
    if not spec.enabled:
        return pin == "none"
    if pin == "none":
        return spec.adaptive_draft_length
    return pin == spec.method or spec.per_request_methods
