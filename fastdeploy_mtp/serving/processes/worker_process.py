"""A worker process: one tensor-parallel rank of a ``fastdeploy-mtp serve`` deployment.

``python -m fastdeploy_mtp.serving.processes.worker_process --local_rank R --tp_master_port P
<layout args>`` (the arguments of :class:`~fastdeploy_mtp.serving.processes.layout.ServeLayout`,
FastDeploy's worker names).

It joins the tensor-parallel group (``paddle.distributed``, gloo), loads its shard of the
checkpoint, builds the target runner and the ``MTPProposer``, which wait for
``cache_ready_signal`` and attach every KV cache by name (they never create one), says
``ready`` to the engine and then runs the steps the engine sends (see
:mod:`fastdeploy_mtp.serving.messages.engine_workers`). After each step rank 0 writes the emitted
tokens to the deployment's token channel (:mod:`~fastdeploy_mtp.serving.token_channel.channel`: the
engine's shared-memory segment, or FastDeploy's SysV message with ``--token-channel sysv``), then
sends its ``done`` message.
On a splitwise prefill instance with MTP, rank 0 sends the first tokens with
``mtp_save_first_token`` instead, as FastDeploy's prefill nodes do: every token such an
instance emits is a first token, and the message also carries the first draft.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...runtime.request import Request, RequestType
from ...runtime.sampling_params import SamplingParams
from ..messages.engine_workers import (
    Done,
    Failed,
    ImportTask,
    PrefillTask,
    Ready,
    Shutdown,
    Step,
    StepResult,
    decode_engine_message,
)
from ..messages.wire import MessageError
from ..token_channel.base import TokenWriter
from ..token_channel.channel import open_writer
from .child_process import Terminated, become_child_process, install_stop_handlers
from .layout import ServeLayout
from .runtime_dir import endpoint

if TYPE_CHECKING:  # imported at run time after the process set-up (they import Paddle)
    from ...config import FDConfig
    from ...runtime.step_output import StepOutput
    from ...runtime.target_runner import TargetRunner
    from ..messages.engine_workers import Task


class SlotTable:
    """A worker's view of the requests in its slots, rebuilt from the step messages' tasks."""

    def __init__(self) -> None:
        self.slots: dict[int, Request] = {}

    def apply(self, task: Task) -> Request:
        """The :class:`Request` for ``task``, updated to describe it (a first prefill chunk
        or an import starts a new request in the slot)."""
        if isinstance(task, ImportTask) or (
            isinstance(task, PrefillTask) and task.prompt_token_ids is not None
        ):
            new = Request(
                task.request_id,
                list(task.prompt_token_ids or []),
                max_tokens=task.max_tokens,
                sampling=task.sampling or SamplingParams(),
            )
            new.idx = task.idx
            if isinstance(task, PrefillTask):
                new.num_cached_tokens = task.start  # (the first chunk starts after a hit)
                new.prefix_without_mtp = task.prefix_without_mtp
            if isinstance(task, ImportTask):
                new.output_token_ids = list(task.output_token_ids)
                new.handoff_state = task.state
            self.slots[task.idx] = new
        req = self.slots.get(task.idx)
        if req is None or req.request_id != task.request_id:
            raise ValueError(
                f"task for request {task.request_id!r} in slot {task.idx}, which holds no such "
                "request"
            )
        req.task_type = RequestType[task.type]
        req.block_tables = list(task.block_tables)
        if isinstance(task, PrefillTask):
            req.prefill_start_index = task.start
            req.prefill_end_index = task.end
            req.output_token_ids = list(task.output_token_ids)
        return req

    def pop(self, idx: int) -> Request | None:
        return self.slots.pop(idx, None)


def send_first_tokens(out: StepOutput, inputs: Any, rank: int, msg_queue_id: int) -> None:
    """Splitwise prefill with MTP: send each slot's first token and first draft
    (``draft_tokens[b, :2]`` of the target's buffers ``inputs``, the first token as ``out``
    emitted it) with ``mtp_save_first_token``; slots that did not just finish their prompt (a
    chunk in the middle, a freed slot) count 0."""
    import paddle

    from ... import ops

    x = inputs.draft_tokens.numpy().copy()
    emitted = out.accept_num.reshape(-1) > 0
    x[emitted, 0] = out.accept_tokens[emitted, 0]
    ops.mtp_save_first_token(
        x=paddle.to_tensor(x),
        not_need_stop=inputs.not_need_stop,
        seq_lens_decoder=inputs.seq_lens_decoder,
        prompt_lens=inputs.prompt_lens,
        step_idx=inputs.step_idx,
        rank_id=rank,
        save_each_rank=False,
        skip_chunk_prefill=True,
        msg_queue_id=msg_queue_id,
    )


def run_step(runner: TargetRunner, slots: SlotTable, msg: Step) -> StepOutput:
    """Apply one step message to ``runner``: reset the freed and aborted slots, load the
    tasks, run the step; returns what it emitted."""
    for idx in msg.free:
        runner.free_slot(idx)
        slots.pop(idx)
    for idx in msg.abort:
        req = slots.pop(idx)
        if req is not None:
            runner.abort_slot(req)
        else:
            runner.free_slot(idx)
    tasks = [slots.apply(t) for t in msg.tasks]
    for req in tasks:
        runner.check_task(req)
    runner.insert_tasks(tasks)
    runner.set_exports(msg.export)
    return runner.execute()


def answer(
    payload: bytes, rank: int, step: Callable[[Step], StepResult | None]
) -> Done | Failed | None:
    """This worker's reply to the engine's ``payload``: ``None`` for :class:`Shutdown`, else
    :class:`Done` with what ``step`` returned (rank 0's result), or :class:`Failed` when the
    message could not be read (the worker goes on: the engine fails that step only) or the
    step raised."""
    try:
        msg = decode_engine_message(payload)
    except MessageError as exc:
        print(f"[worker rank {rank}] refused a message: {exc}", file=sys.stderr, flush=True)
        return Failed(step=None, rank=rank, message=str(exc))
    if isinstance(msg, Shutdown):
        return None
    try:
        result = step(msg)
    except Exception as exc:  # reported to the engine, which aborts the step's requests
        traceback.print_exc(file=sys.stderr)
        return Failed(step=msg.step, rank=rank, message=f"{type(exc).__name__}: {exc}")
    return Done(step=msg.step, rank=rank, result=result)


def load_runner(layout: ServeLayout, rank: int, master_port: int) -> tuple[TargetRunner, FDConfig]:
    """Join the tensor-parallel group (``master_port``: its gloo rendezvous, tp > 1), load
    this rank's slice of the model and build its runner; returns (runner, its config)."""
    from ...assembly import build_runner
    from ...distributed import init_tensor_parallel
    from ...models import load_model

    tp = layout.tensor_parallel_size
    if tp > 1:
        # Paddle's group set-up writes a "Modified FLAGS detected" banner to stderr: only at
        # --log-level debug (an error is raised, not written, so none is lost)
        quiet = layout.log_level != "debug"
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            init_tensor_parallel(rank, tp, master_port)
    target, mtp, arch = load_model(
        layout.model, dtype=layout.dtype, tensor_parallel_size=tp, tensor_parallel_rank=rank
    )
    cfg = layout.fd_config(rank, arch)
    if not cfg.speculative_config.uses_mtp:
        mtp = None  # model-free methods (and no speculation): no MTP layer kept, no MTP caches
    return build_runner(cfg, target, mtp), cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fastdeploy_mtp.serving.processes.worker_process", description=__doc__
    )
    ServeLayout.add_args(ap)
    ap.add_argument("--local_rank", type=int, default=0, help="this worker's tensor-parallel rank")
    ap.add_argument("--tp_master_port", type=int, default=0, help="gloo rendezvous port (tp > 1)")
    args = ap.parse_args(argv)
    layout = ServeLayout.from_args(args)
    rank = int(args.local_rank)
    become_child_process()
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, f"rank{rank}".encode())
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(endpoint(layout.engine_worker_queue_port))  # in the deployment's private directory
    runner = None
    writer: TokenWriter | None = None
    try:
        runner, cfg = load_runner(layout, rank, int(args.tp_master_port))
        slots = SlotTable()
        first_tokens_only = layout.splitwise_role == "prefill" and cfg.speculative_config.enabled
        if rank == 0 and not first_tokens_only:
            k = (
                cfg.speculative_config.num_speculative_tokens
                if cfg.speculative_config.enabled
                else 0
            )
            writer = open_writer(layout, rank, cfg.scheduler_config.max_num_seqs, k)

        def step(msg: Step) -> StepResult | None:
            assert runner is not None
            out = run_step(runner, slots, msg)
            if rank != 0:
                return None
            if first_tokens_only:
                send_first_tokens(out, runner.share_inputs, rank, layout.msg_queue_id)
            else:
                assert writer is not None
                writer.send(out, runner.share_inputs, msg.step)
            return StepResult.of(out, runner.decode_lens())

        install_stop_handlers()  # again, in case Paddle's set-up reinstalled its own
        sock.send(Ready(rank=rank, pid=os.getpid()).encode())
        while True:
            reply = answer(sock.recv(), rank, step)
            if reply is None:
                return 0
            sock.send(reply.encode())
    except Terminated:
        return 0
    except Exception as exc:
        print(
            f"[worker rank {rank}] failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True
        )
        try:
            sock.send(Failed(step=None, rank=rank, message=f"{type(exc).__name__}: {exc}").encode())
        except zmq.ZMQError:
            pass
        return 1
    finally:
        if writer is not None:
            writer.close()
        if runner is not None:
            runner.close()
        sock.close()
        ctx.term()


if __name__ == "__main__":
    sys.exit(main())
