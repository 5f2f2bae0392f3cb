"""What the engine and the workers say to each other over ZMQ (JSON, never pickle: the
socket is a loopback TCP port another local process could reach).

Engine -> every worker (the same message to every tensor-parallel rank):

* ``{"type": "step", "step": n, "free": [idx], "abort": [idx], "tasks": [task], "export":
  [idx]}`` — reset the listed slots, load the tasks, run one target step + proposer round
  (``export``, splitwise prefill: rank 0 returns these slots' state afterwards);
* ``{"type": "shutdown"}`` — release the caches and exit 0.

A task is ``{"idx", "request_id", "type": "PREFILL" | "DECODE", "block_tables"}`` and, for a
prefill chunk, ``"start"``, ``"end"``, ``"max_tokens"``, ``"output_token_ids"`` and (on the
request's first chunk) ``"prompt_token_ids"`` and ``"sampling"`` (the request's
``SamplingParams``). An ``"IMPORT"`` task (splitwise decode) loads a
slot handed over by a prefill instance: ``"prompt_token_ids"``, ``"max_tokens"``,
``"output_token_ids"`` and ``"state"`` (the slot state, see
:mod:`fastdeploy_mtp.splitwise.handoff`).

Worker -> engine:

* ``{"type": "ready", "rank", "pid"}`` once its model is loaded and its caches attached;
* ``{"type": "done", "step", "rank"}`` after a step; rank 0 adds ``"stop_flags"`` ``[N]``,
  ``"decode_lens"`` ``[N]`` (tokens each slot feeds next step), ``"drafts"`` ``[N, K]``
  (the drafts verified this step), ``"decode_mask"`` ``[N]`` (0/1: the slots that decoded
  this step, not prefill) and ``"num_tokens"`` (tokens in the step's target forward), and
  ``"exports"`` ``{idx: state}`` for the slots the step
  message listed in ``export``, and ``"logprobs"`` (:func:`logprobs_message`) for the slots
  whose requests asked. Rank 0 sends the step's tokens *before* this message,
  through ``speculate_save_output_topk`` (FastDeploy's SysV message layout);
* ``{"type": "error", "step", "rank", "message"}`` when the step raised.
"""

from __future__ import annotations

from typing import Any

from ..runtime.request import Request, RequestType
from ..runtime.sampling_params import SamplingParams, TokenLogprob


def task_message(req: Request, first_chunk: bool) -> dict[str, Any]:
    """The wire form of a scheduled task (see the module docstring)."""
    msg: dict[str, Any] = {
        "idx": int(req.idx),
        "request_id": req.request_id,
        "type": req.task_type.name,
        "block_tables": [int(b) for b in req.block_tables],
    }
    if req.task_type == RequestType.PREFILL:
        msg.update(
            start=int(req.prefill_start_index),
            end=int(req.prefill_end_index),
            max_tokens=int(req.max_tokens),
            output_token_ids=[int(t) for t in req.output_token_ids],
        )
        if first_chunk:
            msg["prompt_token_ids"] = [int(t) for t in req.prompt_token_ids]
            msg["sampling"] = req.sampling.to_dict()
    elif req.task_type == RequestType.IMPORT:
        msg.update(
            prompt_token_ids=[int(t) for t in req.prompt_token_ids],
            max_tokens=int(req.max_tokens),
            output_token_ids=[int(t) for t in req.output_token_ids],
            state=req.handoff_state,
            sampling=req.sampling.to_dict(),
        )
    return msg


def logprobs_message(logprobs: dict[int, list[TokenLogprob]]) -> dict[str, list[list[Any]]]:
    """The wire form of ``StepOutput.logprobs``: per slot, ``[token, logprob, [[id, logprob], ...]]``."""
    return {
        str(b): [[e.token_id, e.logprob, [list(t) for t in e.top]] for e in entries] for b, entries in logprobs.items()
    }


def logprobs_of(message: dict[str, list[list[Any]]]) -> dict[int, list[TokenLogprob]]:
    """Inverse of :func:`logprobs_message`."""
    return {
        int(b): [TokenLogprob(int(t), float(lp), [(int(i), float(v)) for i, v in top]) for t, lp, top in entries]
        for b, entries in message.items()
    }


class SlotTable:
    """A worker's view of the requests in its slots, rebuilt from task messages."""

    def __init__(self) -> None:
        self.slots: dict[int, Request] = {}

    def apply(self, task: dict[str, Any]) -> Request:
        """The :class:`Request` for ``task``, updated to describe it (a first prefill chunk
        starts a new request in the slot)."""
        idx = int(task["idx"])
        kind = RequestType[task["type"]]
        if "prompt_token_ids" in task:
            new = Request(
                str(task["request_id"]),
                list(task["prompt_token_ids"]),
                max_tokens=int(task["max_tokens"]),
                sampling=SamplingParams.from_dict(task.get("sampling") or {}),
            )
            new.idx = idx
            if kind == RequestType.IMPORT:
                new.output_token_ids = list(task["output_token_ids"])
                new.handoff_state = task["state"]
            self.slots[idx] = new
        req = self.slots.get(idx)
        if req is None or req.request_id != task["request_id"]:
            raise ValueError(f"task for request {task['request_id']!r} in slot {idx}, which holds no such request")
        req.task_type = kind
        req.block_tables = list(task["block_tables"])
        if kind == RequestType.PREFILL:
            req.prefill_start_index = int(task["start"])
            req.prefill_end_index = int(task["end"])
            req.output_token_ids = list(task["output_token_ids"])
        return req

    def pop(self, idx: int) -> Request | None:
        return self.slots.pop(idx, None)
