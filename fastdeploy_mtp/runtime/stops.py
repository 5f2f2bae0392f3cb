"""Where a request's output stops early: its stop token ids and its stop strings
(:attr:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams.stop_token_ids` and
:attr:`~fastdeploy_mtp.runtime.sampling_params.SamplingParams.stop`).

A speculative step can emit several tokens at once, so a stop may fall inside one step's
tokens: they are cut after a stop token id (kept, like EOS) or before a stop string (not
kept). Stop strings are found in the detokenized text; tokens whose text could be the start
of a stop string are held back (not handed out) until the next tokens tell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .request import InvalidRequestError, Request
from .sampling_params import StepDrafts, TokenLogprob

#: token ids -> text (the engine's ``detokenize``).
Detokenize = Callable[[list[int]], str]


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int:
    """Index in ``text`` where the earliest stop string begins at or after ``start - longest
    stop + 1`` (a stop may straddle old and new text), or -1."""
    best = -1
    for s in stops:
        i = text.find(s, max(0, start - len(s) + 1))
        if i >= 0 and (best < 0 or i < best):
            best = i
    return best


def cut_at_stop_ids(req: Request, new: list[int]) -> tuple[list[int], bool]:
    """Cut ``new`` (this step's tokens of ``req``, possibly several accepted drafts) after
    its first stop token id (kept, like EOS); returns the kept tokens and whether one hit."""
    if req.sampling.stop_token_ids:
        stop_ids = set(req.sampling.stop_token_ids)
        for i, t in enumerate(new):
            if t in stop_ids:
                return new[: i + 1], True
    return new, False


def _tokens_within(detokenize: Detokenize, ids: list[int], chars: int, low: int) -> int:
    """The most tokens ``k >= low`` of ``ids`` whose text is at most ``chars`` long."""
    for k in range(len(ids), low - 1, -1):
        if len(detokenize(ids[:k])) <= chars:
            return k
    return low


def cut_at_stop_string(req: Request, detokenize: Detokenize | None) -> bool:
    """If ``req``'s text contains a stop string, cut its output before it (the tokens and
    their logprobs) and return True. Only text not yet handed out is searched (the held-back
    tail makes sure a stop string never starts inside handed-out text)."""
    stops = req.sampling.stop
    if not stops or detokenize is None:
        return False
    ids = req.output_token_ids
    seen = len(detokenize(ids[: req.emitted_count]))
    at = find_stop(detokenize(ids), stops, seen)
    if at < 0:
        return False
    keep = _tokens_within(detokenize, ids, at, req.emitted_count)
    del ids[keep:]
    del req.output_logprobs[keep:]
    return True


def safe_to_emit(req: Request, detokenize: Detokenize | None) -> int:
    """How many output tokens of ``req`` may be handed out: all but a tail whose text is the
    start of a stop string (it is held back until the next tokens tell)."""
    stops = req.sampling.stop
    ids = req.output_token_ids
    if not stops or detokenize is None:
        return len(ids)
    text = detokenize(ids)
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:n]):
                hold = n
                break
    if not hold:
        return len(ids)
    return _tokens_within(detokenize, ids, len(text) - hold, req.emitted_count)


def finish_reason(req: Request, stopped: bool, eos: set[int]) -> str:
    """Why ``req`` completed: ``"stop"`` at a stop token id or string (``stopped``) or an
    EOS id among ``eos``, ``"length"`` at ``max_tokens`` or ``max_model_len``."""
    if stopped:
        return "stop"
    if len(req.output_token_ids) >= req.max_tokens:
        return "length"
    if req.output_token_ids and req.output_token_ids[-1] in eos:
        return "stop"
    return "length"  # max_model_len


def check_stop_strings(requests: Sequence[object], detokenize: Detokenize | None) -> None:
    """Raise :class:`~fastdeploy_mtp.runtime.request.InvalidRequestError` for the first of
    ``requests`` with stop strings when there is no ``detokenize`` to find them with."""
    if detokenize is not None:
        return
    for req in requests:
        if isinstance(req, Request) and getattr(req.sampling, "stop", None):
            raise InvalidRequestError(
                req.request_id,
                "stop",
                "needs a detokenizer: this engine was built without `detokenize`",
            )


def append_output(
    req: Request,
    new: list[int],
    drafts: list[TokenLogprob] | None,
    logprobs: list[TokenLogprob],
    detokenize: Detokenize | None,
) -> bool:
    """Append one step's tokens ``new`` to ``req``'s output, cut at its first stop token id
    or stop string, with their ``logprobs`` (when the request asked) and the step's verified
    ``drafts`` and their logprobs (``include_draft_logprobs``); returns whether a stop hit."""
    new, stopped = cut_at_stop_ids(req, new)
    if drafts and new:  # the drafts this step verified (a prefill step verifies none)
        req.output_draft_logprobs.append(StepDrafts(len(req.output_token_ids), list(drafts)))
    req.output_token_ids.extend(new)
    if req.sampling.logprobs is not None:
        req.output_logprobs.extend(logprobs[: len(new)])
    return cut_at_stop_string(req, detokenize) or stopped
