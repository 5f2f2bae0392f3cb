"""CPU op benchmarks: each op through the framework-free module on numpy buffers, against a
straightforward numpy implementation of the same semantics (fancy indexing), as ratios
measured in one run (median of repeats). Absolute times depend on the machine.

    python scripts/bench_ops.py                 # every case
    python scripts/bench_ops.py --filter eagle  # cases whose name contains "eagle"
    python scripts/bench_ops.py --repeats 21 --json out.json

Adding a case: write a function that builds the inputs once and returns a `Case`
(`ours` and `baseline` are zero-argument callables returning comparable arrays), and
register it with `@case("name")`. Each case is checked (ours == baseline) before timing.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_report import bench_parser, write_json  # noqa: E402

from fastdeploy_mtp import _kernels  # noqa: E402


@dataclass
class Case:
    ours: Callable[[], Sequence[np.ndarray]]
    baseline: Callable[[], Sequence[np.ndarray]]
    note: str = ""


CASES: dict[str, Callable[[], Case]] = {}


def case(name: str):
    def register(fn: Callable[[], Case]) -> Callable[[], Case]:
        CASES[name] = fn
        return fn

    return register


# ---- gather/scatter ops at T = 8192 rows, H = 4096 (bf16 as uint16 bits, and fp32) -------
T, H = 8192, 4096
DTYPES = {"bf16": np.uint16, "fp32": np.float32}


def _kernel_arg(a: np.ndarray):
    return (a.ctypes.data, "bfloat16", a.shape, "cpu") if a.dtype == np.uint16 else a


def _hidden(rng, rows, dtype):
    if dtype == np.uint16:  # bfloat16 bit patterns
        return rng.integers(0, 1 << 14, size=(rows, H), dtype=np.uint16)
    return rng.standard_normal((rows, H), dtype=np.float32)


def _segment_index(counts_in: np.ndarray, counts_out: np.ndarray, local: np.ndarray) -> np.ndarray:
    """Global input row of every output row: item b's output rows take local rows `local`
    (per output row), offset by the item's input offset."""
    in_off = np.concatenate([[0], np.cumsum(counts_in)[:-1]])
    return np.repeat(in_off, counts_out) + local


def _compact(input_, idx, out_rows):
    out = np.empty((out_rows, input_.shape[1]), input_.dtype)
    out[: idx.size] = input_[idx]
    out[idx.size :] = 0
    return out


def _row_gather(kernel, args, out):
    """The ``ours`` call of a row-gather op: ``kernel(*args)`` writing ``out`` (rows x H) and
    the output row count (int32[1]); returns both."""
    n = np.zeros(1, np.int32)

    def ours():
        kernel(*args, out=_kernel_arg(out), output_token_num=n)
        return out, n

    return ours


def _decode_state(rng, bsz, k=3):
    """Decode round: each item fed 4 target rows (K + 1), accepted 1..4."""
    base = np.full(bsz, k + 1, np.int32)
    acc = rng.integers(1, k + 2, size=bsz).astype(np.int32)
    return base, acc


def _register_gather_cases():
    for tag, dtype in DTYPES.items():

        @case(f"eagle_get_hidden_states T={T} H={H} {tag}")
        def get_hidden(dtype=dtype):
            rng = np.random.default_rng(0)
            bsz = T // 4
            base, acc = _decode_state(rng, bsz)
            x = _hidden(rng, T, dtype)
            slt = np.ones(bsz, np.int32)
            z = np.zeros(bsz, np.int32)
            out = np.empty_like(x)
            args = [_kernel_arg(x), slt, z, z, np.zeros((bsz, 1), bool), acc, base, z, 3]
            ours = _row_gather(_kernels.eagle_get_hidden_states, args, out)

            def baseline():
                local = np.arange(int(acc.sum())) - np.repeat(np.cumsum(acc) - acc, acc)
                idx = _segment_index(base, acc, local)
                return _compact(x, idx, T), np.array([idx.size], np.int32)

            return Case(ours, baseline, f"{bsz} decode items x 4 rows, 1..4 accepted")

        @case(f"eagle_get_self_hidden_states T={T} H={H} {tag}")
        def get_self(dtype=dtype):
            rng = np.random.default_rng(1)
            bsz = T // 4
            last = np.full(bsz, 4, np.int32)
            slt = (rng.random(bsz) < 0.9).astype(np.int32)
            enc = np.zeros(bsz, np.int32)
            x = _hidden(rng, T, dtype)
            out = np.empty_like(x)
            args = [_kernel_arg(x), last, slt, enc]
            ours = _row_gather(_kernels.eagle_get_self_hidden_states, args, out)

            def baseline():
                ends = np.cumsum(last) - 1
                idx = ends[slt > 0]
                return _compact(x, idx, T), np.array([idx.size], np.int32)

            return Case(ours, baseline, f"{bsz} items x 4 rows, 90% active")

        @case(f"eagle_gather_hidden_states T={T} H={H} {tag}")
        def gather(dtype=dtype):
            rng = np.random.default_rng(2)
            bsz = T // 4
            slt = np.where(rng.random(bsz) < 0.9, 4, 0).astype(np.int32)
            rows = int(slt.sum())
            x = _hidden(rng, rows, dtype)
            z = np.zeros(bsz, np.int32)
            out = np.empty((bsz, H), x.dtype)
            args = [
                _kernel_arg(x),
                np.zeros(bsz + 1, np.int32),
                slt,
                z,
                z,
                np.zeros(rows, np.int32),
                np.zeros(bsz + 1, np.int32),
                np.zeros(1, np.int32),
            ]
            ours = _row_gather(_kernels.eagle_gather_hidden_states, args, out)

            def baseline():
                idx = (np.cumsum(slt) - 1)[slt > 0]
                return _compact(x, idx, bsz), np.array([idx.size], np.int32)

            return Case(ours, baseline, f"{bsz} items, 90% active with 4 rows")

        @case(f"speculate_get_logits rows={T} V={H} {tag}")
        def get_logits(dtype=dtype):
            rng = np.random.default_rng(3)
            bsz = T // 4
            enc = np.where(rng.random(bsz) < 0.1, 7, 0).astype(np.int32)
            slt = np.where(enc > 0, enc, 4).astype(np.int32)
            nxt_rows = int(np.where(enc > 0, 1, slt).sum())
            draft = _hidden(rng, T, dtype)
            logits = _hidden(rng, nxt_rows, dtype)
            first = _hidden(rng, bsz, dtype)
            draft_numpy = draft.copy()  # the baseline's own in-place target
            i32 = [
                np.zeros(bsz, np.int32),
                np.zeros(bsz, np.int32),
                np.zeros(bsz + 1, np.int32),
                np.zeros(bsz + 1, np.int32),
            ]

            def ours():
                _kernels.speculate_get_logits(
                    _kernel_arg(draft), *i32, _kernel_arg(logits), _kernel_arg(first), slt, enc
                )
                return draft, i32[3]

            def baseline():
                pre = enc > 0
                nxt = np.where(pre, 1, slt)
                bat = np.where(pre, 2, slt)
                cu_b = np.concatenate([[0], np.cumsum(bat)]).astype(np.int32)
                cu_n = np.concatenate([[0], np.cumsum(nxt)])
                item = np.repeat(np.arange(bsz), bat)
                j = np.arange(int(bat.sum())) - np.repeat(cu_b[:-1], bat)
                from_first = pre[item] & (j == 0)
                src = cu_n[:-1][item] + np.where(pre[item], 0, j)
                dst = draft_numpy
                rows = np.arange(item.size)
                dst[rows[~from_first]] = logits[src[~from_first]]
                dst[rows[from_first]] = first[item[from_first]]
                return dst, cu_b

            return Case(ours, baseline, f"{bsz} items, 10% prefill (in place)")


_register_gather_cases()


# ---- draft-state and target-side ops at bsz 1, 64, 256, 1024 ----------------------------
# Baseline: the numpy reference of tests/reference/ (the op's semantics written as a plain
# per-item loop). The state comes from the op tests' random-batch generators (K = 3).
# The first call of `ours` (the correctness check) sees the pristine state; the timed calls
# repeat the op on the same buffers, i.e. on the state it left (same shapes, same kind of
# work), so no copy is timed.
STATE_BSZ = (1, 64, 256, 1024)


def _state_case(op, make_state, reference, attrs, names, key, ref_kwargs=None, ref_call=None):
    def build(bsz):
        def make():
            tensors = make_state(np.random.default_rng(bsz), bsz)
            pristine = [None if t is None else t.copy() for t in tensors]
            fn = getattr(_kernels, op)

            def ours():
                fn(*tensors, *attrs)
                return [tensors[names.index(k)] for k in key]

            def baseline():
                want = (
                    ref_call(pristine) if ref_call else reference(*pristine, **(ref_kwargs or {}))
                )
                return [want[k] for k in key]

            return Case(
                ours, baseline, f"K = 3, random mix of item states ({', '.join(key)} checked)"
            )

        return make

    for bsz in STATE_BSZ:
        CASES[f"{op} bsz={bsz}"] = build(bsz)


def _register_state_cases():
    from tests.ops import (
        test_draft_model_preprocess as pre,
        test_draft_model_update as upd,
        test_mtp_step_paddle as step,
        test_speculate_pre_process as spp,
        test_unified_update_model_status as uni,
        test_verify_draft_tokens as ver,
    )

    _state_case(
        "draft_model_preprocess",
        lambda r, b: pre.make_state(r, b, 3),
        pre.reference,
        (1, False),
        pre.NAMES,
        ("seq_lens_this_time", "pre_ids"),
        dict(num_model_step=1, is_splitwise_prefill=False),
    )
    _state_case(
        "draft_model_update",
        lambda r, b: upd.make_state(r, b, 3),
        upd.reference,
        (upd.MAX_SEQ_LEN, 0),
        upd.NAMES,
        ("seq_lens_this_time", "base_model_draft_tokens"),
        dict(max_seq_len=upd.MAX_SEQ_LEN, substep=0),
    )
    _state_case(
        "mtp_step_paddle",
        lambda r, b: step.make_state(r, b, 3, free_blocks=max(1, b // 8)),
        step.reference,
        (4, 3),
        step.NAMES,
        ("block_tables", "free_list_len"),
        dict(block_size=4, max_draft_tokens=3),
    )
    _state_case(
        "verify_draft_tokens",
        lambda r, b: ver.make_state(r, b, 3, ver.REJECTION),
        None,
        ver.attrs(ver.REJECTION),
        ver.NAMES,
        ("step_output_ids", "step_output_len"),
        ref_call=lambda t: ver.reference(t, ver.attrs(ver.REJECTION)),
    )
    _state_case(
        "unified_update_model_status",
        lambda r, b: uni.make_state(r, b, 3),
        None,
        (),
        uni.NAMES,
        ("step_idx", "token_ids_all"),
        ref_call=uni.reference,
    )

    def pre_process(bsz):
        def make():
            tensors = spp.make_state(np.random.default_rng(bsz), bsz, 3)
            token_num = int(np.maximum(tensors[1], 0).sum())
            outs = {
                name: np.empty(shape, dtype)
                for name, shape, dtype in spp.out_specs(bsz, 4, token_num)
            }

            def ours():
                _kernels.speculate_pre_process(*tensors, token_num, **outs)
                return [outs["ids_remove_padding"], outs["cu_seq_lens_q_output"]]

            def baseline():
                want = spp.reference(*tensors, cpu_token_num=token_num)
                return [want["ids_remove_padding"], want["cu_seq_lens_q_output"]]

            return Case(ours, baseline, "K = 3, prefill / decode / idle mix")

        return make

    for bsz in STATE_BSZ:
        CASES[f"speculate_pre_process bsz={bsz}"] = pre_process(bsz)


_register_state_cases()


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up (page faults, caches)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--filter", default="", help="run only cases whose name contains this")
    ap.add_argument("--repeats", type=int, default=11)
    args = ap.parse_args(argv)

    results = []
    print(f"{'case':<44} {'ours us':>10} {'numpy us':>10} {'speedup':>8}  note")
    for name, build in CASES.items():
        if args.filter not in name:
            continue
        c = build()
        for label, got, want in zip(("first output", "second output"), c.ours(), c.baseline()):
            if not np.array_equal(np.asarray(got), np.asarray(want)):
                raise SystemExit(f"{name}: ours and the numpy baseline disagree on the {label}")
        ours = median_seconds(c.ours, args.repeats)
        base = median_seconds(c.baseline, args.repeats)
        results.append(
            {
                "case": name,
                "ours_us": ours * 1e6,
                "numpy_us": base * 1e6,
                "speedup": base / ours,
                "note": c.note,
            }
        )
        print(
            f"{name:<44} {ours * 1e6:10.1f} {base * 1e6:10.1f} {base / ours:7.1f}x  {c.note}",
            flush=True,
        )
        del c
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
