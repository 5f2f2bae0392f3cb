"""The JSON report of scripts/gpu_check.sh: device, per-test results of the op tests
("tests", "summary") and of the framework-free end-to-end greedy test ("e2e"), per-op CUDA
latency.

Latency: CUDA-event time per call over many back-to-back launches of each op through the
framework-free module, beside a floor (a one-element in-place torch add, i.e. one kernel
launch through a framework's dispatcher). Ratios are what to compare; absolute numbers
depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastdeploy_mtp import _kernels  # noqa: E402


def parse_junit(path: Path) -> dict:
    results = {}
    if not path.exists():
        return results
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            results[name] = "fail"
        elif case.find("skipped") is not None:
            results[name] = "skip: " + (case.find("skipped").get("message") or "")
        else:
            results[name] = "pass"
    return results


def summarize(tests: dict) -> dict:
    """Counts of passed, failed and skipped tests."""
    return {k: sum(1 for v in tests.values() if v.startswith(k)) for k in ("pass", "fail", "skip")}


def time_calls(torch, fn, iters: int = 200, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters  # microseconds per call


def op_latencies(torch) -> dict:
    stream = torch.cuda.current_stream().cuda_stream
    out = {}
    one = torch.zeros(1, device="cuda")
    out["floor_torch_inplace_add_us"] = time_calls(torch, lambda: one.add_(0))
    rng = np.random.default_rng(0)
    for bsz in (1, 256, 1500, 65536):
        width = 6
        draft = torch.from_numpy(rng.integers(-1, 100, size=(bsz, width), dtype=np.int64)).cuda()
        slt = torch.zeros(bsz, dtype=torch.int32, device="cuda")
        enc = torch.zeros(bsz, dtype=torch.int32, device="cuda")
        stop = torch.zeros(bsz, 1, dtype=torch.bool, device="cuda")
        # raw pointers: the same launcher without the DLPack conversion cost
        raw = [
            (draft.data_ptr(), "int64", tuple(draft.shape), "cuda:0"),
            (slt.data_ptr(), "int32", tuple(slt.shape), "cuda:0"),
            (enc.data_ptr(), "int32", tuple(enc.shape), "cuda:0"),
            (stop.data_ptr(), "bool", tuple(stop.shape), "cuda:0"),
        ]
        out[f"draft_model_postprocess_bsz{bsz}_dlpack_us"] = time_calls(
            torch, lambda: _kernels.draft_model_postprocess(draft, slt, enc, stop, stream=stream)
        )
        out[f"draft_model_postprocess_bsz{bsz}_raw_us"] = time_calls(
            torch, lambda: _kernels.draft_model_postprocess(*raw, stream=stream)
        )
    out.update(verify_update_latencies(torch, stream, rng))
    out.update(hidden_state_latencies(torch, stream))
    out.update(ngram_latencies(torch, stream, rng))
    out.update(ipc_latencies(torch))
    return out


def verify_update_latencies(torch, stream, rng) -> dict:
    """verify_draft_tokens (GREEDY and REJECTION) and unified_update_model_status on an
    all-decode batch with K = 5 (every item owns K + 1 output rows)."""
    out = {}
    for bsz in (1, 256, 1500, 8192):
        w, c = 6, 8
        rows = bsz * w

        def dev(a):
            return torch.from_numpy(np.ascontiguousarray(a)).cuda()

        inp = dev(rng.integers(0, 50, (bsz, w), dtype=np.int64))
        ids = dev(np.tile(np.arange(c, dtype=np.int64), (rows, 1)))
        scores = dev(rng.random((rows, c), dtype=np.float32))
        lens = dev(np.full(rows, c, np.int32))
        uniforms = dev(rng.random((rows, 2), dtype=np.float32))
        target = dev(rng.integers(0, 50, rows, dtype=np.int64))
        out_ids = dev(np.full((bsz, w), -1, np.int64))
        out_len = dev(np.zeros(bsz, np.int32))
        per_item = dict(
            topp=dev(np.ones((bsz, 1), np.float32)),
            stop=dev(np.zeros((bsz, 1), bool)),
            enc=dev(np.zeros(bsz, np.int32)),
            slt=dev(np.full(bsz, w, np.int32)),
            end=dev(np.array([[2]], np.int64)),
            paused=dev(np.zeros(bsz, bool)),
            cu=dev((np.arange(bsz) * w).astype(np.int32)),
            reasoning=dev(np.zeros((bsz, 1), np.int32)),
            max_dec=dev(np.full((bsz, 1), 1 << 40, np.int64)),
            step=dev(np.zeros((bsz, 1), np.int64)),
        )
        p = per_item
        tail = (
            p["topp"],
            p["stop"],
            p["enc"],
            p["slt"],
            p["end"],
            p["paused"],
            p["cu"],
            p["reasoning"],
            p["max_dec"],
            p["step"],
        )
        out[f"verify_draft_tokens_greedy_bsz{bsz}_us"] = time_calls(
            torch,
            lambda: _kernels.verify_draft_tokens(
                out_ids,
                out_len,
                inp,
                target,
                None,
                None,
                None,
                *tail,
                None,
                0,
                2,
                1,
                False,
                False,
                stream=stream,
            ),
        )
        out[f"verify_draft_tokens_rejection_bsz{bsz}_us"] = time_calls(
            torch,
            lambda: _kernels.verify_draft_tokens(
                out_ids,
                out_len,
                inp,
                None,
                ids,
                scores,
                lens,
                *tail,
                uniforms,
                0,
                2,
                3,
                False,
                False,
                stream=stream,
            ),
        )
        # update: keeps re-committing the same outputs (lengths grow; nothing stops)
        hist = dev(np.zeros((bsz, 4096), np.int64))
        running = dev(np.zeros(1, bool))
        dec = dev(np.ones(bsz, np.int32))
        prompt = dev(np.zeros((bsz, 1), np.int64))
        out[f"unified_update_model_status_bsz{bsz}_us"] = time_calls(
            torch,
            lambda: _kernels.unified_update_model_status(
                p["enc"],
                dec,
                running,
                inp,
                out_ids,
                out_len,
                p["stop"],
                p["slt"],
                p["paused"],
                hist,
                prompt,
                p["step"],
                p["end"],
                p["max_dec"],
                stream=stream,
            ),
        )
    return out


def hidden_state_latencies(torch, stream) -> dict:
    """The gather/scatter ops (issue 4) at a few batch sizes, bf16, H = 4096 and an odd H."""
    out = {}
    for bsz, hidden in ((1, 4096), (256, 4096), (2048, 4096), (256, 7)):
        rows = 4 * bsz  # decode: K + 1 = 4 target rows per item
        x = torch.randn(rows, hidden, device="cuda").to(torch.bfloat16)
        i32 = lambda v: torch.full((bsz,), v, dtype=torch.int32, device="cuda")  # noqa: E731
        slt, zero, four, acc = i32(1), i32(0), i32(4), i32(2)
        stop = torch.zeros(bsz, 1, dtype=torch.bool, device="cuda")
        res = torch.empty_like(x)
        n = torch.zeros(1, dtype=torch.int32, device="cuda")
        tag = f"bsz{bsz}_h{hidden}_bf16"
        out[f"eagle_get_hidden_states_{tag}_us"] = time_calls(
            torch,
            lambda: _kernels.eagle_get_hidden_states(
                x,
                slt,
                zero,
                zero,
                stop,
                acc,
                four,
                zero,
                3,
                out=res,
                output_token_num=n,
                stream=stream,
            ),
        )
        out[f"eagle_get_self_hidden_states_{tag}_us"] = time_calls(
            torch,
            lambda: _kernels.eagle_get_self_hidden_states(
                x, four, slt, zero, out=res, output_token_num=n, stream=stream
            ),
        )
        gathered = torch.empty(bsz, hidden, dtype=x.dtype, device="cuda")
        cu = torch.zeros(bsz + 1, dtype=torch.int32, device="cuda")
        out[f"eagle_gather_hidden_states_{tag}_us"] = time_calls(
            torch,
            lambda: _kernels.eagle_gather_hidden_states(
                x,
                cu,
                four,
                zero,
                zero,
                zero,
                cu,
                n,
                out=gathered,
                output_token_num=n,
                stream=stream,
            ),
        )
        draft = torch.empty_like(x)
        nums = [
            i32(0),
            i32(0),
            torch.zeros(bsz + 1, dtype=torch.int32, device="cuda"),
            torch.zeros(bsz + 1, dtype=torch.int32, device="cuda"),
        ]
        first = torch.empty(bsz, hidden, dtype=x.dtype, device="cuda")
        out[f"speculate_get_logits_{tag}_us"] = time_calls(
            torch,
            lambda: _kernels.speculate_get_logits(
                draft, *nums, x, first, four, zero, stream=stream
            ),
        )
        if hidden != 4096:
            continue  # update_attn_mask_offsets has no hidden dimension
        full = torch.zeros(bsz, 64, dtype=torch.int32, device="cuda")
        states = torch.zeros(bsz, 4, dtype=torch.int32, device="cuda")
        ids = torch.zeros(rows, dtype=torch.int64, device="cuda")
        cu4 = torch.arange(0, rows + 1, 4, dtype=torch.int32, device="cuda")
        offsets = torch.empty(2 * rows, dtype=torch.int32, device="cuda")
        out[f"update_attn_mask_offsets_bsz{bsz}_us"] = time_calls(
            torch,
            lambda: _kernels.update_attn_mask_offsets(
                ids,
                four,
                zero,
                four,
                cu4,
                full,
                stop,
                states,
                attn_mask_offsets=offsets,
                stream=stream,
            ),
        )
    return out


def ngram_latencies(torch, stream, rng) -> dict:
    """hybrid_mtp_ngram and ngram_match on CUDA: vocab 32000, the newest 3-gram of each
    history planted in its prompt (n = 5 and 4 scan everything first)."""
    out = {}
    k = 5
    for bsz, prompt_len, hist_len in (
        (1, 4096, 512),
        (64, 32768, 4096),
        (256, 4096, 1024),
        (1, 131072, 4096),
    ):
        prompt = rng.integers(0, 32000, size=(bsz, prompt_len), dtype=np.int64)
        hist = rng.integers(0, 32000, size=(bsz, hist_len + 8), dtype=np.int64)
        at = rng.integers(0, prompt_len - 16, size=bsz)
        for b in range(bsz):
            prompt[b, at[b] : at[b] + 3] = hist[b, hist_len - 2 : hist_len + 1]
        cuda = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
        full = lambda v, dt: torch.full((bsz,), v, dtype=dt, device="cuda")  # noqa: E731
        ids, pre = cuda(prompt), cuda(hist)
        lens, steps = full(prompt_len, torch.int64), full(hist_len, torch.int64)
        draft = torch.full((bsz, k + 1), -1, dtype=torch.int64, device="cuda")
        slt = full(2, torch.int32)
        dec, dtn = full(100, torch.int32), full(k, torch.int32)
        mdl = full(hist_len + 1000, torch.int64)
        tag = f"bsz{bsz}_prompt{prompt_len // 1024}k_hist{hist_len // 1024 or hist_len}"

        def hybrid():
            slt.fill_(2)  # same work every call (adds one fill_ launch to the time)
            _kernels.hybrid_mtp_ngram(
                ids, lens, pre, steps, dtn, draft, slt, dec, mdl, 5, 2, k, 1024, 0, stream=stream
            )

        out[f"hybrid_mtp_ngram_{tag}_us"] = time_calls(torch, hybrid, iters=50, warmup=5)
        enc = full(0, torch.int32)
        all_ids = torch.cat([ids, pre], dim=1).contiguous()

        plain_args = (ids, lens, all_ids, lens, steps, dtn, draft, slt, enc, dec, mdl, 3, k, 128, 0)

        def plain():
            _kernels.ngram_match(*plain_args, stream=stream)

        out[f"ngram_match_{tag}_us"] = time_calls(torch, plain, iters=50, warmup=5)
    return out


def ipc_latencies(torch) -> dict:
    """set_data_ipc on CUDA tensors (cudaIpcGetMemHandle + the named segment) and unlink,
    host wall time per call: these are setup-time calls, not per-step ones. Attaching needs a
    second process (tests/ops/test_ipc_cuda.py checks it)."""
    import os
    import time

    out = {}
    for mib in (1, 64, 1024):
        t = torch.empty(mib << 18, dtype=torch.float32, device="cuda")
        name = f"fdmtp_gpu_check_ipc_{os.getpid()}"
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            _kernels.set_data_ipc(t, name)
            times.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        _kernels.unset_data_ipc(None, name, False, True)
        out[f"set_data_ipc_{mib}mib_us"] = min(times) * 1e6
        out[f"unset_data_ipc_unlink_{mib}mib_us"] = (time.perf_counter() - t1) * 1e6
        del t
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--junit", type=Path, required=True)
    ap.add_argument("--build-seconds", type=int, default=-1)
    ap.add_argument("--tests-rc", type=int, default=-1)
    ap.add_argument(
        "--e2e-junit", type=Path, help="junit of tests/e2e/test_framework_free_greedy.py"
    )
    ap.add_argument("--e2e-rc", type=int, default=-1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    report = {
        "build_info": _kernels.build_info(),
        "cuda_status": list(_kernels.cuda_status()),
        "build_seconds": args.build_seconds,
        "pytest_returncode": args.tests_rc,
    }
    try:
        import torch

        report["device"] = torch.cuda.get_device_name(0)
        report["capability"] = list(torch.cuda.get_device_capability(0))
        report["latency_us"] = op_latencies(torch)
    except Exception as e:  # report what went wrong instead of losing the test results
        report["latency_error"] = repr(e)
    tests = parse_junit(args.junit)
    report["tests"] = tests
    report["summary"] = summarize(tests)
    if args.e2e_junit is not None:
        e2e = parse_junit(args.e2e_junit)
        report["e2e"] = {"pytest_returncode": args.e2e_rc, "tests": e2e, "summary": summarize(e2e)}
    text = json.dumps(report, indent=1, sort_keys=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
