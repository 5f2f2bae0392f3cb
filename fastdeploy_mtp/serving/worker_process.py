"""A worker process: one tensor-parallel rank of a ``fastdeploy-mtp serve`` deployment.

``python -m fastdeploy_mtp.serving.worker_process --local_rank R --tp_master_port P <layout args>`` (the
arguments of :class:`~fastdeploy_mtp.serving.layout.ServeLayout`, FastDeploy's worker names).

It joins the tensor-parallel group (``paddle.distributed``, gloo), loads its shard of the
checkpoint, builds the target runner and the ``MTPProposer``, which wait for
``cache_ready_signal`` and attach every KV cache by name (they never create one), says
``ready`` to the engine and then runs the steps the engine sends (see
:mod:`fastdeploy_mtp.serving.protocol`). After each step rank 0 sends the emitted tokens with
``speculate_save_output_topk`` (FastDeploy's SysV message layout), then its ``done`` message.
On a splitwise prefill instance with MTP, rank 0 sends the first tokens with
``mtp_save_first_token`` instead, as FastDeploy's prefill nodes do: every token such an
instance emits is a first token, and the message also carries the first draft.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

import numpy as np

from .layout import ServeLayout, Terminated, become_child_process, install_stop_handlers

if TYPE_CHECKING:  # imported at run time after the process set-up (they import Paddle)
    from ..runtime.target_runner import StepOutput, TargetRunner
    from .protocol import SlotTable

#: ``message_flag`` of the target's token messages (FastDeploy: 3 target, 4 draft).
TARGET_MESSAGE_FLAG = 3


def send_step_tokens(out: StepOutput, inputs: Any, rank: int, msg_queue_id: int) -> None:
    """Send the tokens step ``out`` emitted (``accept_tokens[b, :accept_num[b]]`` per slot) with
    ``speculate_save_output_topk``: one packed row per token, no logprobs (score 0, rank 0).
    Slots still prefilling a prompt (``seq_lens_decoder < prompt_lens`` in the target's
    buffers ``inputs``) count 0."""
    import paddle

    from .. import ops

    counts = np.clip(out.accept_num.astype(np.int32).reshape(-1), 0, out.accept_tokens.shape[1])
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
    rows = np.concatenate([out.accept_tokens[b, : counts[b]] for b in range(len(counts))]).astype(np.int64)
    n = int(rows.shape[0])
    ops.speculate_save_output_topk(
        sampled_token_ids=paddle.to_tensor(rows.reshape([n, 1])),
        logprob_token_ids=paddle.to_tensor(rows.reshape([n, 1])),
        logprob_scores=paddle.zeros([n, 1], dtype="float32"),
        logprob_ranks=paddle.zeros([n], dtype="int64"),
        token_num_per_batch=paddle.to_tensor(counts),
        cu_batch_token_offset=paddle.to_tensor(offsets),
        not_need_stop=inputs.not_need_stop,
        seq_lens_decoder=inputs.seq_lens_decoder,
        prompt_lens=inputs.prompt_lens,
        preempted_idx=paddle.zeros([len(counts)], dtype="int32"),
        message_flag=TARGET_MESSAGE_FLAG,
        rank_id=rank,
        save_each_rank=False,
        msg_queue_id=msg_queue_id,
    )


def send_first_tokens(out: StepOutput, inputs: Any, rank: int, msg_queue_id: int) -> None:
    """Splitwise prefill with MTP: send each slot's first token and first draft
    (``draft_tokens[b, :2]`` of the target's buffers ``inputs``, the first token as ``out``
    emitted it) with ``mtp_save_first_token``; slots that did not just finish their prompt (a
    chunk in the middle, a freed slot) count 0."""
    import paddle

    from .. import ops

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


def run_step(runner: TargetRunner, slots: SlotTable, msg: dict[str, Any]) -> StepOutput:
    """Apply one ``step`` message to ``runner``: reset the freed and aborted slots, load the
    tasks, run the step; returns what it emitted."""
    for idx in msg["free"]:
        runner.free_slot(int(idx))
        slots.pop(int(idx))
    for idx in msg["abort"]:
        req = slots.pop(int(idx))
        if req is not None:
            runner.abort_slot(req)
        else:
            runner.free_slot(int(idx))
    tasks = [slots.apply(t) for t in msg["tasks"]]
    for req in tasks:
        runner.check_task(req)
    runner.insert_tasks(tasks)
    runner.set_exports([int(i) for i in msg.get("export", [])])
    return runner.execute()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastdeploy_mtp.serving.worker_process", description=__doc__)
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
    sock.connect(f"tcp://127.0.0.1:{layout.engine_worker_queue_port}")
    runner = None
    try:
        from ..distributed import init_tensor_parallel
        from ..models import load_tiny
        from ..runtime.target_runner import TargetRunner
        from .protocol import SlotTable, logprobs_message

        tp = layout.tensor_parallel_size
        if tp > 1:
            init_tensor_parallel(rank, tp, int(args.tp_master_port))
        target, mtp, arch = load_tiny(layout.model, tensor_parallel_size=tp, tensor_parallel_rank=rank)
        cfg = layout.fd_config(rank, arch)
        runner = TargetRunner(cfg, target, mtp if cfg.speculative_config.enabled else None)
        slots = SlotTable()
        first_tokens_only = layout.splitwise_role == "prefill" and cfg.speculative_config.enabled
        install_stop_handlers()  # again, in case Paddle's set-up reinstalled its own
        sock.send_json({"type": "ready", "rank": rank, "pid": os.getpid()})
        while True:
            msg = sock.recv_json()
            assert isinstance(msg, dict)
            if msg.get("type") == "shutdown":
                return 0
            step = msg.get("step")
            try:
                out = run_step(runner, slots, msg)
                if rank == 0 and first_tokens_only:
                    send_first_tokens(out, runner.share_inputs, rank, layout.msg_queue_id)
                elif rank == 0:
                    send_step_tokens(out, runner.share_inputs, rank, layout.msg_queue_id)
            except Exception as exc:  # reported to the engine, which aborts the step's requests
                traceback.print_exc(file=sys.stderr)
                sock.send_json({"type": "error", "step": step, "rank": rank, "message": f"{type(exc).__name__}: {exc}"})
                continue
            reply: dict[str, Any] = {"type": "done", "step": step, "rank": rank}
            if rank == 0:
                reply.update(
                    stop_flags=out.stop_flags.astype(int).tolist(),
                    decode_lens=runner.decode_lens().astype(int).tolist(),
                    drafts=out.drafts.astype(int).tolist(),
                    decode_mask=out.decode_mask.astype(int).tolist(),
                    num_tokens=int(out.num_tokens),
                    exports={str(idx): state for idx, state in out.exports.items()},
                    logprobs=logprobs_message(out.logprobs),
                )
            sock.send_json(reply)
    except Terminated:
        return 0
    except Exception as exc:
        print(f"[worker rank {rank}] failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        try:
            sock.send_json({"type": "error", "step": None, "rank": rank, "message": f"{type(exc).__name__}: {exc}"})
        except zmq.ZMQError:
            pass
        return 1
    finally:
        if runner is not None:
            runner.close()
        sock.close()
        ctx.term()


if __name__ == "__main__":
    sys.exit(main())
