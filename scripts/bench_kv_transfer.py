"""KV-transfer throughput per transport: a prefill-side :class:`KVSource` in one process
offers blocks, a decode-side :func:`pull_blocks` in another copies them, for 1 MiB, 64 MiB
and 512 MiB of KV (2 ranks x 4 caches, 64 KiB blocks).

``mooncake`` and ``tcp`` cross a real link: the two processes run in two network namespaces
joined by a veth pair through a bridge (``tests/support/netns.py``; needs root and
iproute2), each with a ``/dev/shm`` of its own. ``shm`` is the same-host transport: both
processes on this host, the source's caches published under shared-memory names.

    sudo python scripts/bench_kv_transfer.py [--sizes 1,64,512] [--repeats 3] [--json out.json]

Each cell is the median of ``--repeats`` pulls (a fresh offer each, the destination touched
once beforehand so page faults are not timed). Ratios between rows of one run are what to
compare; absolute numbers depend on the machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_report import bench_parser, print_table, write_json  # noqa: E402

from tests.support.netns import Hosts  # noqa: E402

BLOCK_BYTES = 64 << 10  # per cache
CACHES, RANKS = 4, 2


def _layout_code() -> str:
    return """
import json, sys, time
import numpy as np
from fastdeploy_mtp.models.cache_spec import describe, key_value_specs
from fastdeploy_mtp.splitwise.kv_layout import KVLayout

def make(blocks, fill):
    shape = (blocks, 2, 1024, 8)  # 64 KiB of float32 per block
    caches = [[(np.full(shape, fill + c, np.float32) if fill else np.zeros(shape, np.float32))
               for c in range(4)] for _ in range(2)]
    desc = describe(
        key_value_specs("target", 1, shape, "float32") + key_value_specs("mtp", 1, shape, "float32")
    )
    return caches, KVLayout.of_caches(caches, desc)
"""


SOURCE = (
    _layout_code()
    + """
from fastdeploy_mtp.splitwise.kv_source import KVSource
blocks, transport = int(sys.argv[1]), sys.argv[2]
caches, layout = make(blocks, 1.0)
options = {}
if transport == "shm":
    import os, paddle
    from fastdeploy_mtp.ipc.kv_caches import cache_names, publish_caches, unpublish_caches
    tensors = [[paddle.to_tensor(a) for a in rank] for rank in caches]
    names = [cache_names(0, 2, r, 90000 + os.getpid() % 1000) for r in range(2)]
    for t, n in zip(tensors, names):
        publish_caches(t, n)
    caches = [[np.from_dlpack(t) for t in rank] for rank in tensors]
    options["shm_names"] = names
source = KVSource(caches, layout, lambda r, s: None,
                  host="0.0.0.0" if transport != "shm" else "127.0.0.1",
                  mooncake=transport == "mooncake", **options)
for line in sys.stdin:  # one offer per line asked
    print(json.dumps(source.offer(line.strip(), list(range(blocks)))), flush=True)
source.close()
if transport == "shm":
    for t, n in zip(tensors, names):
        unpublish_caches(t, n)
"""
)

PULL = (
    _layout_code()
    + """
from fastdeploy_mtp.splitwise.kv_client import pull_blocks
blocks, transport = int(sys.argv[1]), sys.argv[2]
caches, layout = make(blocks, 0.0)
for rank in caches:
    for c in rank:
        c[:] = 0.5  # touch every page once
for line in sys.stdin:
    descriptor = json.loads(line)
    t0 = time.perf_counter()
    moved = pull_blocks(descriptor, caches, layout, list(range(blocks)), transport, timeout=300)
    seconds = time.perf_counter() - t0
    ok = all(float(c[0, 0, 0, 0]) == 1.0 + i and float(c[-1, -1, -1, -1]) == 1.0 + i
             for rank in caches for i, c in enumerate(rank))
    print(json.dumps({"bytes": moved, "seconds": seconds, "ok": ok}), flush=True)
"""
)


def measure(hosts: Hosts | None, transport: str, mib: int, repeats: int) -> dict[str, float]:
    blocks = max(1, (mib << 20) // (BLOCK_BYTES * CACHES * RANKS))

    def run(where: str, code: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-c", code, str(blocks), transport]
        cmd = argv if hosts is None else hosts.command(where, argv, private_shm=True)
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    source, puller = run("prefill", SOURCE), run("decode", PULL)
    assert source.stdin and source.stdout and puller.stdin and puller.stdout
    results = []
    try:
        for i in range(repeats + 1):  # the first pull warms the connection and the engine up
            source.stdin.write(f"bench-{i}\n")
            source.stdin.flush()
            puller.stdin.write(source.stdout.readline())
            puller.stdin.flush()
            result = json.loads(puller.stdout.readline())
            if not result["ok"]:
                raise RuntimeError(f"{transport} {mib} MiB: the copied blocks are wrong")
            if i:
                results.append(result)
    finally:
        for proc in (puller, source):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(60)
    seconds = statistics.median(r["seconds"] for r in results)
    moved = results[0]["bytes"]
    return {"bytes": moved, "seconds": seconds, "gib_per_s": moved / seconds / 2**30}


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--sizes", default="1,64,512", help="MiB of KV per transfer, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--transports", default="shm,tcp,mooncake")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with Hosts(["prefill", "decode"]) as hosts:
        for transport in args.transports.split(","):
            for mib in sizes:
                print(f"[bench_kv_transfer] {transport} {mib} MiB", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                row = measure(None if transport == "shm" else hosts, transport, mib, args.repeats)
                row.update(transport=transport, mib=mib, wall_s=time.perf_counter() - t0)
                rows.append(row)
    print_table(
        ("transport", "path", "KV per transfer", "median s", "GiB/s"),
        (
            (
                r["transport"],
                "same host" if r["transport"] == "shm" else "across namespaces (veth + bridge)",
                f"{r['bytes'] / 2**20:.0f} MiB",
                f"{r['seconds']:.4f}",
                f"{r['gib_per_s']:.2f}",
            )
            for r in rows
        ),
    )
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
