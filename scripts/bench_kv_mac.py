"""What authenticating the KV bytes costs (``fastdeploy_mtp/splitwise/kv_mac.py``).

Two tables:

1. The MAC alone: MB/s of HMAC-SHA256 (what the frames are tagged with), keyed BLAKE2b and
   bare SHA-256 over one data frame (one cache's blocks of one rank) of 64 KiB, 4 MiB
   (32 blocks of 128 KiB: a 2k-token prompt of an 8-KV-head, 128-dim bf16 layer) and
   32 MiB.
2. A hand-over: the median wall time of ``pull_blocks`` per transport and KV size, a source
   in this process (its server thread) and the pull in the main thread, without the
   splitwise secret (nothing signed: no control MAC, no answer MAC, no frame tag) and with
   it (every control request, answer and tcp frame; for mooncake the ``digest``
   round trip, P and D hashing at the same time). Caches: 2 ranks x 4 caches of 64 KiB
   blocks.

    python scripts/bench_kv_mac.py [--sizes 0.5,16,128] [--repeats 5] \
        [--transports tcp,shm,mooncake]

Ratios between rows of one run are what to compare; absolute numbers depend on the machine
(and on its other load: the pulls share the cores with the source's thread).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_report import bench_parser, print_table, write_json  # noqa: E402

from fastdeploy_mtp.models.cache_spec import describe, key_value_specs  # noqa: E402
from fastdeploy_mtp.splitwise.kv_client import pull_blocks  # noqa: E402
from fastdeploy_mtp.splitwise.kv_layout import KVLayout  # noqa: E402
from fastdeploy_mtp.splitwise.kv_source import KVSource  # noqa: E402

BLOCK_SHAPE = (2, 1024, 8)  # 64 KiB of float32 per block and cache
RANKS, CACHES = 2, 4
SECRET = b"bench-kv-mac-secret-0123456789"


def mac_speeds(frame_bytes: int, repeats: int) -> dict[str, float]:
    """MB/s of each MAC over one ``frame_bytes`` frame (the best of ``repeats``)."""
    key = os.urandom(32)
    frame = np.random.default_rng(0).integers(0, 255, frame_bytes, np.uint8)
    ways = {
        "HMAC-SHA256": lambda: hmac.new(key, frame, "sha256").digest(),
        "keyed BLAKE2b": lambda: hashlib.blake2b(frame, key=key, digest_size=32).digest(),
        "SHA-256 (no key)": lambda: hashlib.sha256(frame).digest(),
    }
    speeds = {}
    for name, run in ways.items():
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t0)
        speeds[name] = frame_bytes / best / 1e6
    return speeds


def make_caches(blocks: int, fill: float | None) -> tuple[list[list[np.ndarray]], KVLayout]:
    shape = (blocks, *BLOCK_SHAPE)
    rng = np.random.default_rng(1)
    caches = [
        [
            rng.standard_normal(shape, np.float32)
            if fill is None
            else np.full(shape, fill, np.float32)
            for _ in range(CACHES)
        ]
        for _ in range(RANKS)
    ]
    specs = key_value_specs("target", 1, shape, "float32") + key_value_specs(
        "mtp", 1, shape, "float32"
    )
    return caches, KVLayout.of_caches(caches, describe(specs))


def publish(caches: list[list[np.ndarray]]) -> tuple[Any, list[list[str]], list[list[np.ndarray]]]:
    """The source's caches published under shared-memory names (as a cache manager does)."""
    import paddle

    from fastdeploy_mtp.ipc.kv_caches import cache_names, publish_caches

    tensors = [[paddle.to_tensor(a) for a in rank] for rank in caches]
    names = [cache_names(0, CACHES // 2, r, 95000 + os.getpid() % 1000) for r in range(RANKS)]
    for t, n in zip(tensors, names):
        publish_caches(t, n)
    return tensors, names, [[np.from_dlpack(t) for t in rank] for rank in tensors]


def pull_seconds(transport: str, blocks: int, secret: bytes | None, repeats: int) -> float:
    """The median seconds of one ``pull_blocks`` of ``blocks`` blocks (after one warm-up)."""
    src, layout = make_caches(blocks, None)
    dst, dst_layout = make_caches(blocks, 0.5)
    options: dict[str, Any] = {"mooncake": transport == "mooncake"}
    published = None
    if transport == "shm":
        tensors, names, src = publish(src)
        published = (tensors, names)
        options["shm_names"] = names
    source = KVSource(src, layout, lambda r, s: None, secret=secret, **options)
    seconds = []
    try:
        for i in range(repeats + 1):
            descriptor = source.offer(f"bench-{i}", list(range(blocks)))
            t0 = time.perf_counter()
            pull_blocks(descriptor, dst, dst_layout, list(range(blocks)), transport, 300, secret)
            if i:
                seconds.append(time.perf_counter() - t0)
        if not all(np.array_equal(d, s) for dr, sr in zip(dst, src) for d, s in zip(dr, sr)):
            raise RuntimeError(f"{transport}: the copied blocks are wrong")
    finally:
        source.close()
        if published is not None:
            from fastdeploy_mtp.ipc.kv_caches import unpublish_caches

            for t, n in zip(*published):
                unpublish_caches(t, n)
    return statistics.median(seconds)


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--sizes", default="0.5,16,128", help="MiB of KV per hand-over")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--transports", default="tcp,shm,mooncake")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    mac_rows = []
    for frame in (64 << 10, 4 << 20, 32 << 20):
        for name, speed in mac_speeds(frame, args.repeats).items():
            mac_rows.append({"mac": name, "frame_bytes": frame, "mb_per_s": speed})
    print_table(
        ("MAC", "frame", "MB/s"),
        ((r["mac"], f"{r['frame_bytes'] >> 10} KiB", f"{r['mb_per_s']:.0f}") for r in mac_rows),
    )
    print()
    block_bytes = RANKS * CACHES * int(np.prod(BLOCK_SHAPE)) * 4
    for transport in args.transports.split(","):
        for mib in (float(s) for s in args.sizes.split(",")):
            blocks = max(1, int(mib * 2**20) // block_bytes)
            print(f"[bench_kv_mac] {transport} {mib:g} MiB", file=sys.stderr, flush=True)
            plain = pull_seconds(transport, blocks, None, args.repeats)
            signed = pull_seconds(transport, blocks, SECRET, args.repeats)
            rows.append(
                {
                    "transport": transport,
                    "bytes": blocks * block_bytes,
                    "plain_us": plain * 1e6,
                    "signed_us": signed * 1e6,
                }
            )
    print_table(
        (
            "transport",
            "KV per hand-over",
            "without secret, µs",
            "with MACs, µs",
            "added µs",
            "added",
        ),
        (
            (
                r["transport"],
                f"{r['bytes'] / 2**20:g} MiB",
                f"{r['plain_us']:.0f}",
                f"{r['signed_us']:.0f}",
                f"{r['signed_us'] - r['plain_us']:.0f}",
                f"{(r['signed_us'] / r['plain_us'] - 1) * 100:+.0f}%",
            )
            for r in rows
        ),
    )
    write_json(args.json, [*mac_rows, *rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
