"""The typed messages between the processes (:mod:`fastdeploy_mtp.serving.messages.engine_workers`):
each survives its wire form unchanged; a wrong version, a missing field or a wrong type is refused
with an error that names it; a worker that receives a malformed message fails that step
only; the engine drops (and counts) every reply that is not the one it awaits, so a stray
frame fails nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from fastdeploy_mtp.credentials import DroppedMessages
from fastdeploy_mtp.runtime.sampling_params import SamplingParams, TokenLogprob

# the messages by protocol: ``ew.Step`` (engine <-> workers), ``ri.PrefillRequest`` (router <->
# splitwise instances)
from fastdeploy_mtp.serving.messages import engine_workers as ew, router_instances as ri
from fastdeploy_mtp.serving.messages.wire import (
    PROTOCOL_VERSION,
    MessageError,
    check_header_version,
)
from fastdeploy_mtp.serving.processes.remote_runner import (
    RemoteRunner,
    WorkerDiedError,
    WorkerStepError,
)
from fastdeploy_mtp.serving.processes.worker_process import answer
from tests.support.servers import remote_runner

LOGPROB = TokenLogprob(7, -0.25, [(7, -0.25), (9, -1.5)])
SAMPLING = SamplingParams(temperature=0.7, top_k=5, seed=3, stop=["\n"], logprobs=2)
STEP = ew.Step(
    step=4,
    free=[1],
    abort=[2],
    tasks=[
        ew.PrefillTask(
            idx=0,
            request_id="a",
            block_tables=[3, 4],
            start=0,
            end=5,
            max_tokens=8,
            output_token_ids=[],
            prompt_token_ids=[1, 2, 3, 4, 5],
            sampling=SAMPLING,
        ),
        ew.PrefillTask(
            idx=3,
            request_id="c",
            block_tables=[5],
            start=5,
            end=9,
            max_tokens=8,
            output_token_ids=[],
        ),
        ew.DecodeTask(idx=1, request_id="b", block_tables=[0]),
        ew.ImportTask(
            idx=2,
            request_id="d",
            block_tables=[6],
            prompt_token_ids=[1, 2],
            max_tokens=4,
            output_token_ids=[9],
            state={"target": {"step_idx": [1]}},
            sampling=SamplingParams(),
        ),
    ],
    export=[0],
)
RESULT = ew.StepResult(
    stop_flags=[False, True],
    decode_lens=[4, 0],
    drafts=[[1, 2, 3], [0, 0, 0]],
    decode_mask=[True, False],
    num_tokens=9,
    exports={0: {"target": {"step_idx": [2]}}},
    logprobs={0: [LOGPROB]},
    guided_forced=2,
    guided_forced_accepted=1,
    mtp_unseen=[False, True],
)


@pytest.mark.parametrize(
    "message",
    [STEP, ew.Shutdown()],
    ids=["step", "shutdown"],
)
def test_engine_messages_round_trip(message):
    got = ew.decode_engine_message(message.encode())
    assert got == message and type(got) is type(message)


@pytest.mark.parametrize(
    "message",
    [
        ew.Ready(rank=1, pid=42),
        ew.Done(step=4, rank=0, result=RESULT),
        ew.Done(step=4, rank=1),
        ew.Failed(step=None, rank=0, message="x"),
    ],
    ids=["ready", "done", "done-rank1", "error"],
)
def test_worker_messages_round_trip(message):
    got = ew.decode_worker_message(message.encode())
    assert got == message and type(got) is type(message)


def test_result_keeps_its_types():
    got = ew.decode_worker_message(ew.Done(step=1, rank=0, result=RESULT).encode())
    assert isinstance(got, ew.Done) and got.result is not None
    assert got.result.logprobs == {0: [LOGPROB]} and isinstance(
        got.result.logprobs[0][0], TokenLogprob
    )
    assert list(got.result.exports) == [0]
    assert got.result.mtp_unseen == [False, True]  # (the engine keeps their blocks uncached)
    task = ew.decode_engine_message(STEP.encode()).tasks[0]  # type: ignore[union-attr]
    assert isinstance(task, ew.PrefillTask) and task.sampling == SAMPLING


@pytest.mark.parametrize(
    "message",
    [
        ri.PrefillRequest(request_id="a", prompt_token_ids=[1], max_tokens=3, sampling=SAMPLING),
        ri.DecodeRequest(
            request_id="a",
            prompt_token_ids=[1],
            max_tokens=3,
            output_token_ids=[2],
            handoff={"state": {}, "kv": {}},
        ),
        ri.PrefillAnswer(
            request_id="a",
            output_token_ids=[7],
            output_logprobs=[LOGPROB],
            draft_token_ids=[1, 2],
            finished=False,
            handoff={"state": {}, "kv": {}},
        ),
        ri.HandoffMessage(state={"target": {}}, kv={"version": 1}, signature="0" * 64),
        ri.ErrorMessage(error=ri.ErrorDetail(message="no", type="server_error", code=500)),
    ],
    ids=["prefill", "decode", "answer", "handoff", "error"],
)
def test_http_messages_round_trip(message):
    assert ri.decode_http(type(message), message.encode(), "test") == message


def test_decode_events_keep_the_shape_clients_see():
    tokens = ri.TokensEvent(token_ids=[1, 2])
    assert json.loads(tokens.model_dump_json(exclude_none=True)) == {"token_ids": [1, 2]}
    assert ri.decode_event(tokens.model_dump_json(exclude_none=True), "test") == tokens
    with_logprobs = ri.TokensEvent(token_ids=[7], logprobs=[LOGPROB])
    assert ri.decode_event(with_logprobs.model_dump_json(), "test") == with_logprobs
    assert ri.decode_event('{"finish_reason": "length"}', "test") == ri.FinishEvent(
        finish_reason="length"
    )
    error = ri.decode_event(
        '{"error": {"message": "lost", "type": "server_error", "code": 500}}', "test"
    )
    assert isinstance(error, ri.ErrorMessage) and error.error.message == "lost"
    # the router's request bodies are what the instances always read (no version key: it is a
    # header)
    body = ri.PrefillRequest(
        request_id="a", prompt_token_ids=[1], max_tokens=3, sampling=SamplingParams()
    )
    assert json.loads(body.encode()) == {
        "request_id": "a",
        "prompt_token_ids": [1],
        "max_tokens": 3,
        "sampling": SamplingParams().to_dict(),
        "cache_namespace": "",  # the global prefix-cache namespace
    }


def _raw(message: Any, **change: Any) -> bytes:
    raw = json.loads(message.encode())
    for key, value in change.items():
        if value is ...:
            del raw[key]
        else:
            raw[key] = value
    return json.dumps(raw).encode()


def test_another_version_is_refused_naming_both():
    other = PROTOCOL_VERSION + 1
    with pytest.raises(
        MessageError,
        match=rf"protocol version {other}; this process speaks version {PROTOCOL_VERSION}",
    ):
        ew.decode_engine_message(_raw(STEP, version=other))
    # even when the rest does not fit this version's fields either
    with pytest.raises(MessageError, match=rf"protocol version {other};"):
        ew.decode_worker_message(_raw(ew.Ready(rank=0, pid=1), version=other, pid="new"))
    with pytest.raises(
        MessageError,
        match=rf"sent no protocol version; this process speaks version {PROTOCOL_VERSION}",
    ):
        ew.decode_worker_message(_raw(ew.Ready(rank=0, pid=1), version=...))
    with pytest.raises(MessageError, match=rf"the router speaks protocol version {other};"):
        check_header_version(str(other), "the router")
    with pytest.raises(MessageError, match=r"sent no protocol version"):
        check_header_version(None, "the router")
    check_header_version(str(PROTOCOL_VERSION), "the router")


def test_a_missing_field_or_a_wrong_type_is_named():
    with pytest.raises(MessageError, match=r"from a worker: .*rank: Field required") as missing:
        ew.decode_worker_message(_raw(ew.Done(step=1, rank=0), rank=...))
    assert missing.value.field is not None and "rank" in missing.value.field
    with pytest.raises(MessageError, match=r"step: Input should be a valid integer"):
        ew.decode_engine_message(_raw(STEP, step="four"))
    with pytest.raises(MessageError, match=r"tasks\.0\.PREFILL\.start"):
        raw = json.loads(STEP.encode())
        del raw["tasks"][0]["start"]
        ew.decode_engine_message(json.dumps(raw).encode())
    with pytest.raises(MessageError, match=r"type"):
        ew.decode_engine_message(_raw(STEP, type="jump"))
    with pytest.raises(MessageError, match=r"malformed"):
        ew.decode_engine_message(b"{not json")
    with pytest.raises(MessageError, match=r"Extra inputs are not permitted"):
        ri.decode_http(
            ri.PrefillRequest,
            b'{"request_id": "a", "prompt_token_ids": [], "max_tokens": 1, "x": 1}',
            "test",
        )
    with pytest.raises(MessageError, match=r"sampling.top_k"):
        ri.decode_http(
            ri.PrefillRequest,
            b'{"request_id": "a", "prompt_token_ids": [], "max_tokens": 1, '
            b'"sampling": {"top_k": 1.5}}',
            "t",
        )


# ---- receivers ------------------------------------------------------------------------------
def test_a_worker_answers_a_malformed_message_and_goes_on():
    ran: list[int] = []

    def step(msg: ew.Step) -> ew.StepResult | None:
        ran.append(msg.step)
        if msg.step == 2:
            raise RuntimeError("boom")
        return RESULT

    refused = answer(_raw(STEP, version=9), rank=0, step=step)
    assert (
        isinstance(refused, ew.Failed)
        and refused.step is None
        and "protocol version 9" in refused.message
    )
    assert isinstance(answer(b"\xff", rank=0, step=step), ew.Failed)
    done = answer(ew.Step(step=1).encode(), rank=0, step=step)
    assert done == ew.Done(step=1, rank=0, result=RESULT)
    failed = answer(ew.Step(step=2).encode(), rank=0, step=step)
    assert (
        isinstance(failed, ew.Failed)
        and failed.step == 2
        and "RuntimeError: boom" in failed.message
    )
    assert answer(ew.Shutdown().encode(), rank=0, step=step) is None
    assert ran == [1, 2]


class _Socket:
    """The engine's worker socket, replaying ``payloads`` as rank 0's replies."""

    def __init__(self, payloads: list[bytes], identity: bytes = b"rank0"):
        self.payloads, self.identity = payloads, identity

    def poll(self, timeout: int) -> bool:
        return bool(self.payloads)

    def recv_multipart(self) -> list[bytes]:
        return [self.identity, self.payloads.pop(0)]


def _engine_side(payloads: list[bytes], identity: bytes = b"rank0") -> RemoteRunner:
    """A :class:`RemoteRunner` with no processes, whose step ``1`` replies are ``payloads``
    (each sent by ``identity``)."""
    runner = RemoteRunner.__new__(RemoteRunner)
    runner._sock = _Socket(payloads, identity)  # type: ignore[assignment]
    runner._step = 1
    runner._dead = None
    runner.step_timeout = 0.5
    runner.procs = {}
    runner.dropped = DroppedMessages()
    runner.layout = type("Layout", (), {"tensor_parallel_size": 1})()  # type: ignore[assignment]
    runner._drain_tokens = lambda: None  # type: ignore[method-assign]
    return runner


@pytest.mark.parametrize(
    "payload, words",
    [
        (ew.Done(step=1, rank=0).encode(), "without its result"),
        (ew.Failed(step=None, rank=0, message="refused: bad step").encode(), "refused: bad step"),
    ],
    ids=["no-result", "unread-step"],
)
def test_the_engine_fails_the_step_on_a_bad_answer_not_the_deployment(payload, words):
    runner = _engine_side([payload])
    with pytest.raises(WorkerStepError, match=words):
        runner._replies()
    assert runner.dead is None  # WorkerStepError: the engine aborts the step's requests and goes on


STRAYS = {
    "not-an-object": b"[1, 2]",
    "version": _raw(ew.Done(step=1, rank=0, result=RESULT), version=PROTOCOL_VERSION + 1),
    "other-step": ew.Done(step=999999, rank=0, result=RESULT).encode(),
    "ready": ew.Ready(rank=0, pid=1).encode(),
    "other-rank": ew.Done(step=1, rank=1, result=RESULT).encode(),
    "bytes": b"\xff" * 44,
}


@pytest.mark.parametrize("stray", list(STRAYS.values()), ids=list(STRAYS))
def test_a_reply_that_is_not_the_awaited_one_is_dropped_and_counted(stray):
    good = ew.Done(step=1, rank=0, result=RESULT).encode()
    runner = _engine_side([stray, stray, good])
    assert runner._replies() == RESULT  # the real answer still arrives: nothing failed
    assert runner.dropped.counts()["worker"] == 2
    assert runner.dead is None


def test_a_frame_from_a_peer_that_is_not_a_worker_is_dropped():
    runner = _engine_side([ew.Done(step=1, rank=0, result=RESULT).encode()], identity=b"intruder")
    with pytest.raises(
        WorkerDiedError, match="no answer from the workers"
    ):  # only the step timeout
        runner._replies()
    assert runner.dropped.counts()["worker"] == 1


def test_a_real_worker_refuses_malformed_messages_and_keeps_serving():
    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.models import ByteTokenizer
    from fastdeploy_mtp.runtime.request import Request

    spec = '{"method": "mtp", "num_speculative_tokens": 1, "num_model_steps": 1}'
    with remote_runner(spec, 2, 128) as runner:
        for bad in (
            b"{not json",
            _raw(ew.Step(step=1), version=PROTOCOL_VERSION + 1),
            _raw(ew.Step(step=1), free="x"),
        ):
            runner._sock.send_multipart([b"rank0", bad])
            reply = runner._recv(time.monotonic() + 60, "test")
            assert isinstance(reply, ew.Failed) and reply.step is None, reply
        assert all(p.poll() is None for p in runner.procs.values()), "a process exited"
        engine = build_engine(runner.fd_config, runner=runner)
        results = engine.generate(
            [Request("a", ByteTokenizer().encode("hello"), max_tokens=4)], max_steps=50
        )
        assert len(results["a"]) == 4
