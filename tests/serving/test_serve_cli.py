"""``fastdeploy-mtp serve`` refuses what it cannot serve before starting any process: one
line naming the option, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fastdeploy_mtp.entrypoints.cli import main
from fastdeploy_mtp.ops import messaging


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(["serve", "--port", "1", *args])
    return code, capsys.readouterr().err


def test_more_slots_than_kernel_msgmax_carries_is_refused_with_the_fix(capsys):
    msgmax = messaging.read_msgmax()
    fits = (msgmax - 2060) // 1032  # FastDeploy's layout: the meta block, then one entry per slot
    if fits >= messaging.MAX_BSZ:
        pytest.skip(f"kernel.msgmax ({msgmax}) carries every slot the layout has")
    code, err = run(capsys, "--token-channel", "sysv", "--max-num-seqs", str(fits + 1))
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"sysctl -w kernel.msgmax={messaging.topk_message_bytes(fits + 1)}" in err
    assert (
        f"--max-num-seqs {fits + 1}" in err
        and "kernel.msgmax" in err
        and f"--max-num-seqs {fits} or fewer" in err
    )


@pytest.mark.parametrize("role", ["mixed", "decode"])
@pytest.mark.parametrize("k", [6, 8])
def test_more_drafts_than_the_sysv_message_carries_are_refused_with_the_fix(capsys, role, k):
    code, err = run(
        capsys,
        "--token-channel",
        "sysv",
        "--splitwise-role",
        role,
        "--speculative-config",
        f'{{"num_speculative_tokens": {k}, "num_model_steps": 1}}',
    )
    assert code == 2 and err.count("\n") == 1
    assert (
        f"--token-channel sysv: num_speculative_tokens {k} needs {k + 1} tokens per request and "
        "step, but FastDeploy's SysV token message carries 6; use --token-channel shm (the "
        "default) or num_speculative_tokens <= 5"
    ) in err


@pytest.mark.parametrize(
    "args",
    [
        ["--token-channel", "sysv", "--num-speculative-tokens", "5"],
        # a prefill instance with MTP sends first tokens (2 per request), on either channel
        ["--token-channel", "sysv", "--splitwise-role", "prefill", "--num-speculative-tokens", "8"],
        ["--num-speculative-tokens", "8"],
    ],
)
def test_drafts_the_token_message_carries_pass_the_draft_check(capsys, args):
    """The refusal is the later KV memory check's (so no process starts)."""
    code, err = run(capsys, *args, "--kv-cache-memory", "4KiB")
    assert code == 2 and err.count("\n") == 1 and "--kv-cache-memory" in err, err


def test_more_slots_than_the_sysv_message_has_are_refused_with_the_fix(capsys):
    code, err = run(capsys, "--token-channel", "sysv", "--max-num-seqs", "513")
    assert code == 2 and err.count("\n") == 1
    assert "--max-num-seqs 513: FastDeploy's SysV token message has room for 512 slots" in err
    assert "use --token-channel shm or --max-num-seqs" in err


@pytest.mark.parametrize(
    "args, word",
    [
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size"),
        (["--device-ids", "a,b"], "--device-ids"),
        (["--splitwise-port", "9000"], "--splitwise-role prefill"),
        (["--splitwise-role", "decode", "--kv-transfer-timeout", "0"], "--kv-transfer-timeout"),
        (["--splitwise-role", "prefill", "--kv-hold-timeout", "-1"], "--kv-hold-timeout"),
        (["--splitwise-role", "decode", "--max-waiting-requests", "0"], "--max-waiting-requests"),
        (["--prefill-chunk-size", "-1"], "--prefill-chunk-size"),
        (["--port", "65536"], "--port"),
        (["--port", "0"], "--port"),
        (["--engine-worker-queue-port", "99999"], "--engine-worker-queue-port"),
        (["--splitwise-role", "prefill", "--splitwise-port", "70000"], "--splitwise-port"),
        (["--device-ids", "-1"], "--device-ids"),
        (["--device-ids", "0,,1"], "--device-ids"),
    ],
)
def test_bad_options_are_one_line_usage_errors(capsys, args, word):
    code, err = run(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and word in err


def test_a_tensor_parallel_size_the_heads_do_not_divide_is_refused(capsys):
    code, err = run(capsys, "--tensor-parallel-size", "3")
    assert code == 2 and err.count("\n") == 1
    assert "num_attention_heads" in err or "num_key_value_heads" in err


def test_a_prefill_instance_is_not_capped_by_kernel_msgmax_but_by_the_first_token_layout(capsys):
    """Its workers send first tokens with mtp_save_first_token (7176 bytes for 256 slots), so
    only more slots than that message has are refused."""
    code, err = run(
        capsys,
        "--splitwise-role",
        "prefill",
        "--num-speculative-tokens",
        "3",
        "--max-num-seqs",
        "257",
    )
    assert code == 2 and err.count("\n") == 1 and "--max-num-seqs 257" in err and "256" in err


def test_the_ready_figure_counts_from_the_process_start():
    """``process_started`` (what the start-up lines and "ready in" count from) is the start of
    the process, before its imports: a process that slept first is that much older."""
    script = (
        "import time; time.sleep(0.6)\n"
        "from fastdeploy_mtp.serving.processes.start_up import process_started\n"
        "print(time.perf_counter() - process_started())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert 0.6 <= float(out.stdout) < 60
