"""The token channel between worker rank 0 and the engine (``serve --token-channel``), the
capacity flags (``--kv-cache-memory``, ``--max-num-batched-tokens``), and servers beyond
the SysV message's slot limit.

The unit tests run the shm channel in this process; the two servers are stopped with
SIGTERM and must leave no process, no ``/dev/shm`` name and no SysV queue behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from fastdeploy_mtp.capacity import parse_memory, plan_capacity
from fastdeploy_mtp.entrypoints.cli import main
from fastdeploy_mtp.ops import messaging
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.serving.token_channel.base import TokenChannelError, WorkerStepError
from fastdeploy_mtp.serving.token_channel.shared_memory import (
    ShmTokenReader,
    ShmTokenWriter,
    shm_bytes,
)
from tests.support.servers import (
    device_ids,
    http_post,
    offline,
    scrape_metrics,
    serving,
    shm_names,
)

SPEC = (
    '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1, '
    '"mtp_strategy": "with_ngram"}'
)
MAX_TOKENS = 16


class _Host:
    """A tensor stand-in: what ``.numpy()`` returns."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def numpy(self) -> np.ndarray:
        return self.a


def _step(
    n: int, width: int, seed: int, prefilling: tuple[int, ...] = ()
) -> tuple[SimpleNamespace, SimpleNamespace]:
    rng = np.random.default_rng(seed)
    out = SimpleNamespace(
        accept_tokens=rng.integers(0, 50_000, [n, width], dtype=np.int64),
        accept_num=rng.integers(0, width + 1, [n], dtype=np.int64),
    )
    dec = np.full([n, 1], 100, np.int32)
    dec[list(prefilling), 0] = 3
    inputs = SimpleNamespace(
        seq_lens_decoder=_Host(dec), prompt_lens=_Host(np.full([n, 1], 10, np.int64))
    )
    return out, inputs


@pytest.fixture
def name(request):
    n = f"fdmtp_step_tokens.test{os.getpid()}_{request.node.name[-24:].strip('[]')}"
    yield n
    if os.path.lexists(f"/dev/shm/{n}"):
        os.unlink(f"/dev/shm/{n}")


@pytest.mark.parametrize("n", [1, 256])
def test_shm_round_trip(name, n):
    width = 4
    reader = ShmTokenReader(name, n, width)
    st = os.stat(f"/dev/shm/{name}")
    assert st.st_mode & 0o777 == 0o600 and st.st_size == shm_bytes(n, width)
    writer = ShmTokenWriter(name, n, width)
    for step in (1, 2):
        out, inputs = _step(n, width, step, prefilling=(0,))
        writer.send(out, inputs, step)
        tokens, counts = reader.read(step)
        assert tokens.dtype == np.int64 and tokens.shape == (n, width)
        assert counts.dtype == np.int64 and counts.shape == (n,)
        np.testing.assert_array_equal(tokens, out.accept_tokens)
        expect = out.accept_num.copy()
        expect[0] = 0  # still prefilling its prompt: FastDeploy's message counts it 0
        np.testing.assert_array_equal(counts, expect)
    with pytest.raises(WorkerStepError, match="step 2's tokens, expected step 3"):
        reader.read(3)
    writer.close()
    reader.close()
    reader.close()
    assert not os.path.lexists(f"/dev/shm/{name}")


def test_a_segment_is_created_once_and_a_dead_runs_is_replaced(name):
    reader = ShmTokenReader(name, 2, 2)
    with pytest.raises(TokenChannelError, match=f"running deployment \\(pid {os.getpid()}\\)"):
        ShmTokenReader(name, 2, 2)
    reader.close()
    fd = os.open(
        f"/dev/shm/{name}", os.O_CREAT | os.O_WRONLY, 0o600
    )  # a dead run's (no live creator)
    os.write(fd, b"\0" * 64)
    os.close(fd)
    ShmTokenReader(name, 2, 2).close()
    assert not os.path.lexists(f"/dev/shm/{name}")


def test_a_name_owned_by_another_or_a_link_is_refused(name, tmp_path):
    os.symlink(tmp_path / "elsewhere", f"/dev/shm/{name}")
    with pytest.raises(TokenChannelError, match="not this user's"):
        ShmTokenReader(name, 2, 2)
    assert not (tmp_path / "elsewhere").exists()
    os.unlink(f"/dev/shm/{name}")
    if os.geteuid() == 0:  # root can hand a file to another user
        fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
        os.chown(f"/dev/shm/{name}", 65534, 65534)
        with pytest.raises(TokenChannelError, match="uid 65534"):
            ShmTokenReader(name, 2, 2)


def test_the_writer_attaches_only_the_engines_private_segment(name):
    with pytest.raises(TokenChannelError, match="cannot open"):
        ShmTokenWriter(name, 2, 2)
    reader = ShmTokenReader(name, 2, 2)
    with pytest.raises(TokenChannelError, match="bytes, expected"):
        ShmTokenWriter(name, 3, 2)
    os.chmod(f"/dev/shm/{name}", 0o644)
    with pytest.raises(TokenChannelError, match="mode 0600"):
        ShmTokenWriter(name, 2, 2)
    reader.close()


def test_capacity_rule():
    common = dict(block_size=16, block_bytes=1 << 10, max_model_len=1024, k=3, slot_cap=256, tp=1)
    plan = plan_capacity(
        **common, max_num_seqs=None, kv_memory=8 << 20, max_num_batched_tokens=None
    )
    assert plan.max_num_seqs == min(256, 8192 // (16 + 3)) and plan.total_block_num == 8192
    assert plan.max_num_batched_tokens == max(256, plan.max_num_seqs * 4 + 64)
    plan = plan_capacity(**common, max_num_seqs=2, kv_memory=8 << 20, max_num_batched_tokens=9)
    assert plan.total_block_num == 2 * (64 + 3)  # never more than the slots can fill
    with pytest.raises(ValueError, match="--max-num-batched-tokens 8: must be at least"):
        plan_capacity(**common, max_num_seqs=2, kv_memory=8 << 20, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        plan_capacity(**common, max_num_seqs=None, kv_memory=10 << 10, max_num_batched_tokens=None)
    assert (
        parse_memory("auto") is None
        and parse_memory("2GiB") == 2 << 30
        and parse_memory("1.5k") == 1500
    )


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(["serve", "--port", "1", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "args, word",
    [
        (["--max-num-seqs", "8", "--max-num-batched-tokens", "20"], "--max-num-batched-tokens 20"),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
        (["--kv-cache-memory", "lots"], "--kv-cache-memory"),
        (["--kv-cache-memory", "4KiB"], "--kv-cache-memory"),
        (["--token-channel", "pipe"], "--token-channel"),
    ],
)
def test_bad_capacity_flags_are_one_line_usage_errors(capsys, args, word):
    code, err = run(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and word in err, err


def test_sysv_beyond_msgmax_is_refused_with_the_sysctl(capsys):
    fits = messaging.topk_slots_within(messaging.read_msgmax())
    if fits >= 64:
        pytest.skip("kernel.msgmax carries 64 slots here")
    code, err = run(capsys, "--token-channel", "sysv", "--max-num-seqs", "64")
    assert code == 2 and f"sysctl -w kernel.msgmax={messaging.topk_message_bytes(64)}" in err


@pytest.fixture(scope="module")
def expected():
    return offline(DEMO_PROMPTS, SPEC, MAX_TOKENS)


def _complete(base_url: str, prompt: str) -> str:
    body = {"model": "fastdeploy-mtp-tiny", "prompt": prompt, "max_tokens": MAX_TOKENS}
    status, answer = http_post(base_url + "/v1/completions", body, timeout=120)
    assert status == 200, answer
    return answer["choices"][0]["text"]


def test_shm_serves_64_slots_beyond_the_sysv_limit(expected):
    with contextlib.contextmanager(serving)(
        ["--speculative-config", SPEC, "--max-num-seqs", "64", "--token-channel", "shm"]
    ) as srv:
        assert "64 slots" in srv.output() and "token channel shm" in srv.output()
        prompts = [DEMO_PROMPTS[i % len(DEMO_PROMPTS)] for i in range(48)]
        peak, done = [0.0], threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(
                    peak[0], scrape_metrics(srv.base_url).get("fastdeploy:num_requests_running", 0)
                )
                time.sleep(0.02)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with ThreadPoolExecutor(48) as pool:
                texts = list(pool.map(lambda p: _complete(srv.base_url, p), prompts))
        finally:
            done.set()
            watcher.join()
        want = dict(zip(DEMO_PROMPTS, expected))
        assert texts == [want[p] for p in prompts]
        assert peak[0] > 5, f"at most {peak[0]} requests ran at once"


def test_sysv_channel_serves_through_fastdeploys_message(expected):
    args = ["--speculative-config", SPEC, "--token-channel", "sysv", "--no-enable-prefix-caching"]
    with contextlib.contextmanager(serving)(
        args, slots=None
    ) as srv:  # serve's own default for sysv
        log = srv.output()
        fits = messaging.topk_slots_within(messaging.read_msgmax())
        assert (
            f"{min(8, fits)} slots" in log
            and "token channel sysv" in log
            and "prefix caching off" in log
        )
        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(lambda p: _complete(srv.base_url, p), DEMO_PROMPTS[:4]))
        assert texts == expected[:4]
        assert not [n for n in os.listdir("/dev/shm") if n == f"fdmtp_step_tokens.{srv.queue_port}"]


#: the most drafts any command accepts, all from the MTP layer (so every round offers 8)
EIGHT_DRAFTS = '{"method": "mtp", "num_speculative_tokens": 8, "num_model_steps": 8}'


def test_shm_serves_eight_drafts_with_the_tokens_of_plain_decoding():
    openai = pytest.importorskip("openai")
    prompts = DEMO_PROMPTS[:2]
    want = offline(prompts, '{"method": null}', MAX_TOKENS)
    with contextlib.contextmanager(serving)(
        ["--speculative-config", EIGHT_DRAFTS, "--token-channel", "shm"]
    ) as srv:
        assert "MTP K=8 S=8" in srv.output() and "token channel shm" in srv.output()
        c = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="-", max_retries=0, timeout=120)
        texts = [
            c.completions.create(model="fastdeploy-mtp-tiny", prompt=p, max_tokens=MAX_TOKENS)
            .choices[0]
            .text
            for p in prompts
        ]
        m = scrape_metrics(srv.base_url)
    assert texts == want
    per_pos = 'fastdeploy:spec_decode_num_{}_tokens_per_pos_total{{method="mtp",position="{}"}}'
    assert m[per_pos.format("draft", 8)] > 0 and m[per_pos.format("accepted", 8)] >= 0
    assert per_pos.format("draft", 9) not in m


def test_sysv_with_six_drafts_exits_with_the_reason_and_leaves_nothing_behind():
    """Refused before any process starts: exit status 2, one line saying why and what to do;
    no child process, ``/dev/shm`` name or listener left."""
    before = shm_names()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fastdeploy_mtp.entrypoints.cli", "serve", "--port", "1"]
        + ["--token-channel", "sysv", "--num-speculative-tokens", "6"]
        + ["--device-ids", device_ids(1)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 2 and out == "" and err.count("\n") == 1, err
    assert (
        "--token-channel sysv: num_speculative_tokens 6 needs 7 tokens per request and step, "
        "but FastDeploy's SysV token message carries 6; use --token-channel shm (the default) or "
        "num_speculative_tokens <= 5"
    ) in err
    assert _in_session(proc.pid) == [] and shm_names() - before == set()


def _in_session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (a child the command started would stay in it)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry}/stat", "rb") as f:
                state, _, _, session = f.read().rsplit(b")", 1)[1].split()[:4]
            if int(session) == sid and state != b"Z":
                found.append(int(entry))
    return found


def test_sysv_writer_is_read_by_fastdeploys_reader():
    """The sysv channel: rank 0's ``speculate_save_output_topk`` message, read back with
    ``speculate_get_output_topk`` (the slots the default kernel.msgmax carries)."""
    import paddle

    from fastdeploy_mtp.serving.token_channel.sysv import SysvTokenReader, SysvTokenWriter

    n, width = min(5, messaging.topk_slots_within(messaging.read_msgmax())), 4
    queue = 700_000 + os.getpid() % 100_000
    messaging.create_msg_queue(queue)
    try:
        out, inputs = _step(n, width, 7, prefilling=(1,))
        host = SimpleNamespace(
            seq_lens_decoder=paddle.to_tensor(inputs.seq_lens_decoder.numpy()),
            prompt_lens=paddle.to_tensor(inputs.prompt_lens.numpy()),
            not_need_stop=paddle.to_tensor([True]),
        )
        out.accept_tokens %= 1 << 31  # the message narrows token ids to C int, as FastDeploy's does
        SysvTokenWriter(0, queue).send(out, host, 1)
        tokens, counts = SysvTokenReader(queue, n, width - 1).read(1)
        expect = out.accept_num.copy()
        expect[1] = 0
        np.testing.assert_array_equal(counts, expect)
        mask = np.arange(width)[None, :] < expect[:, None]
        np.testing.assert_array_equal(tokens[mask], out.accept_tokens[mask])
    finally:
        messaging.remove_msg_queue(queue)
