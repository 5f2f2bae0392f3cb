"""What the linear-attention state of a hybrid model (Qwen3-Next, Qwen3.5) costs: bytes per slot
and the time of the rollback after each verification, in one run.

Rows: the real Qwen3-Next-80B-A3B layout (48 layers, a full-attention layer every 4th, so 36
Gated DeltaNet layers of 32 value heads and 16 key heads of 128, a convolution of kernel 4) at
tensor-parallel sizes 1, 4 and 8 (one rank's share), and the tiny test folder's layout; for K = 1
and 3 and batches of 1 and 8 slots (every slot verified, accepted counts drawn at random). The
rollback is :meth:`~fastdeploy_mtp.models.linear_state.LinearStates.commit` on this CPU; bytes
are one slot's committed state and its ``K + 1`` snapshot rows, float32.

    python scripts/bench_linear_state.py [--repeat 20] [--json out.json]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from bench_report import bench_parser, print_table, write_json  # noqa: E402

from fastdeploy_mtp.models.hybrid_config import HybridSpec  # noqa: E402
from fastdeploy_mtp.models.linear_state import LinearStates, state_specs  # noqa: E402


def layout(layers: int, key_heads: int, value_heads: int, k_dim: int, v_dim: int) -> HybridSpec:
    types = tuple(
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
    )
    return HybridSpec(
        layer_types=types,
        linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=k_dim,
        linear_value_head_dim=v_dim,
        linear_conv_kernel_dim=4,
        fused_projections=True,
    )


class _Config:
    def __init__(self, hybrid: HybridSpec):
        self.hybrid = hybrid


MODELS = [
    ("Qwen3-Next-80B-A3B, TP 1", layout(48, 16, 32, 128, 128), 1),
    ("Qwen3-Next-80B-A3B, TP 4", layout(48, 16, 32, 128, 128), 4),
    ("Qwen3-Next-80B-A3B, TP 8", layout(48, 16, 32, 128, 128), 8),
    ("tiny test folder", layout(4, 2, 4, 16, 24), 1),
]


def commit_us(states: LinearStates, slots: int, k: int, repeat: int) -> float:
    rng = np.random.default_rng(0)
    times = []
    for _ in range(repeat):
        accept = paddle.to_tensor(rng.integers(1, k + 2, slots).astype("int32"))
        verified = paddle.to_tensor(np.ones(slots, bool))
        t0 = time.perf_counter()
        states.commit(accept, verified)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    rows, table = [], []
    for name, hybrid, tp in MODELS:
        for k in (1, 3):
            per_slot = sum(s.nbytes for s in state_specs(_Config(hybrid), 1, k + 1, tp))
            state_only = sum(
                s.nbytes for s in state_specs(_Config(hybrid), 1, k + 1, tp) if "snap" not in s.kind
            )
            for slots in (1, 8):
                specs = state_specs(_Config(hybrid), slots, k + 1, tp)
                tensors = [paddle.zeros(list(s.shape)) for s in specs]
                us = commit_us(LinearStates.from_tensors(specs, tensors), slots, k, args.repeat)
                del tensors
                rows.append(
                    {"model": name, "k": k, "slots": slots, "bytes_per_slot": per_slot,
                     "state_bytes_per_slot": state_only, "commit_us": us}
                )  # fmt: skip
                table.append(
                    [name, str(k), str(slots), f"{state_only / 2**20:.2f}",
                     f"{per_slot / 2**20:.2f}", f"{us:.0f}"]
                )  # fmt: skip
    print_table(
        ["layout", "K", "slots", "state MiB/slot", "with snapshots MiB/slot", "rollback µs"], table
    )
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
