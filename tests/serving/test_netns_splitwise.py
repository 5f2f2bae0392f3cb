"""Splitwise across hosts: the prefill instance, the decode instances and the router each run
in a network namespace of their own (:class:`~tests.support.netns.Hosts`: one bridged /24,
no route anywhere else, a ``/dev/shm`` of their own), so the KV blocks cross a real network
link over the Mooncake transfer engine or over the KV port (``tcp``), never shared memory.

Checked: P->D equals the offline (mixed) engine token for token, greedy and seeded, at TP 1
and 2 over each cross-host transport; ``auto`` picks the transfer engine when P's caches are
not on the decode host; the prefill instance advertises an address the decode host reaches
(found by itself behind ``--host 0.0.0.0``, or ``--kv-advertise-host``); the per-transport
metrics count the transfers; a prefill instance killed in the middle of a transfer fails
that request on the decode side and leaves the decode instance whole. The bare KV source and
``pull_blocks`` cross the link too, with 64 MiB of blocks.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from fastdeploy_mtp.distributed import find_free_port_range
from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from fastdeploy_mtp.runtime.sampling_params import SamplingParams
from tests.support.netns import Hosts
from tests.support.servers import (
    ServerProcess,
    device_ids,
    http_get,
    queues_with_id,
    router_command,
    scrape_metrics,
    stop_all,
    stopped_cleanly,
)

MODEL = "fastdeploy-mtp-tiny"
MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3}'
MAX_TOKENS = 24
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 7}
PROMPTS = DEMO_PROMPTS[:4]


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    with Hosts(["prefill", "decode", "router"]) as made:
        yield made


@pytest.fixture(scope="module")
def expected() -> dict[str, list[str]]:
    """The offline engine's texts, greedy and seeded (what a mixed server serves)."""
    from fastdeploy_mtp.config import SpeculativeConfig
    from fastdeploy_mtp.entrypoints.offline import run_requests

    spec = SpeculativeConfig.from_json(MTP3)
    out = {}
    for key, sampling in (("greedy", SamplingParams()), ("seeded", SamplingParams(**SAMPLED))):
        _, texts, _ = run_requests(PROMPTS, MAX_TOKENS, spec, 4, "offline", None, sampling)
        out[key] = texts
    assert out["greedy"] != out["seeded"]
    return out


class Router:
    """``fastdeploy-mtp router`` as a process on the router host."""

    def __init__(self, hosts: Hosts, prefill: ServerProcess, decode: ServerProcess):
        self.hosts = hosts
        port = find_free_port_range(1)
        self.url = f"http://{hosts.addresses['router']}:{port}"
        argv = router_command(port)
        argv += [
            "--host",
            hosts.addresses["router"],
            "--prefill",
            prefill.base_url,
            "--decode",
            decode.base_url,
        ]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            hosts.command("router", argv), stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 120
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                self.log.seek(0)
                raise RuntimeError(f"the router did not start:\n{self.log.read().decode()}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            return self.hosts.call("router", http_get, self.url + "/health", 2)[0] == 200
        except OSError:
            return False

    def complete(self, prompt: str, **fields: Any) -> tuple[str, str | None]:
        """(text, finish reason) of one streamed completion, sent from the router host."""

        def run() -> tuple[str, str | None]:
            c = openai.OpenAI(
                base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120
            )
            text, reason = "", None
            for chunk in c.completions.create(
                model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, stream=True, **fields
            ):
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
            return text, reason

        return self.hosts.call("router", run)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(30)


def instance(hosts: Hosts, where: str, role: str, tp: int, *extra: str) -> ServerProcess:
    args = ["--speculative-config", MTP3, "--splitwise-role", role, "--max-num-seqs", "4"]
    args += ["--tensor-parallel-size", str(tp), "--device-ids", device_ids(tp), *extra]
    return ServerProcess(args, on=(hosts, where))


def metric(server: ServerProcess, name: str) -> float:
    return server.reach(scrape_metrics, server.base_url).get(f"fastdeploy:{name}", 0.0)


@contextlib.contextmanager
def deployed(servers: list[ServerProcess], routers: list[Router]) -> Iterator[None]:
    """Stop the routers, then the instances (decode first), each checked for a clean stop."""
    try:
        yield
    finally:
        codes = [r.stop() for r in routers]
        try:
            for srv in reversed(servers):
                stopped_cleanly(srv)
        finally:
            stop_all(servers)
        assert codes == [130] * len(routers), codes  # SIGINT: the Ctrl-C status


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def pd(request: Any, hosts: Hosts) -> Iterator[dict[str, Any]]:
    """One prefill instance (bound to every interface, offering the transfer engine) and two
    decode instances on the decode host, one per cross-host transport, each with its router.
    At TP 1 the prefill instance finds its own address and the transfer-engine decode
    instance is left at ``auto``; at TP 2 both are named (``--kv-advertise-host``,
    ``--kv-transport mooncake``)."""
    tp = request.param
    servers: list[ServerProcess] = []
    routers: list[Router] = []
    with deployed(servers, routers):
        p_extra = ["--host", "0.0.0.0", "--kv-transport", "mooncake"]
        if tp == 2:
            p_extra += ["--kv-advertise-host", hosts.addresses["prefill"]]
        servers.append(instance(hosts, "prefill", "prefill", tp, *p_extra))
        decode = {}
        for transport in ("mooncake", "tcp"):
            asked = "auto" if (tp, transport) == (1, "mooncake") else transport
            servers.append(instance(hosts, "decode", "decode", tp, "--kv-transport", asked))
            decode[transport] = servers[-1]
            routers.append(Router(hosts, servers[0], servers[-1]))
        yield {
            "tp": tp,
            "prefill": servers[0],
            "decode": decode,
            "router": dict(zip(("mooncake", "tcp"), routers)),
        }


@pytest.mark.parametrize("transport", ["mooncake", "tcp"])
def test_netns_prefill_and_decode_on_other_hosts_equal_mixed(
    pd: dict[str, Any], hosts: Hosts, expected: dict[str, list[str]], transport: str
) -> None:
    p, d, router = pd["prefill"], pd["decode"][transport], pd["router"][transport]
    # the address the prefill instance advertises is its own on the shared network: found
    # behind --host 0.0.0.0 at TP 1, named at TP 2
    assert f"KV blocks served on tcp://{hosts.addresses['prefill']}:" in p.output()
    series = f'splitwise_kv_transfers_total{{transport="{transport}"}}'
    before = metric(d, series)
    greedy = [router.complete(prompt) for prompt in PROMPTS]
    seeded = [router.complete(prompt, **SAMPLED) for prompt in PROMPTS]
    assert [t for t, _ in greedy] == expected["greedy"]
    assert [t for t, _ in seeded] == expected["seeded"]
    assert {r for _, r in greedy + seeded} == {"length"}
    assert metric(d, series) - before == 2 * len(
        PROMPTS
    )  # every request crossed over this transport
    assert metric(d, f'splitwise_kv_transfer_bytes_total{{transport="{transport}"}}') > 0
    assert metric(d, "splitwise_kv_transfer_failures_total") == 0
    assert (
        metric(d, 'splitwise_kv_transfers_total{transport="shm"}') == 0
    )  # no shared memory across hosts


def test_netns_a_prefill_instance_killed_mid_transfer(hosts: Hosts) -> None:
    """With the prefill host's link slowed so a transfer takes seconds, SIGKILL the prefill
    instance once it handed a request over: the client gets an error naming the failed KV
    transfer, the decode instance counts the failure, gets every block back and stops cleanly."""
    servers: list[ServerProcess] = []
    routers: list[Router] = []
    with deployed(servers, routers):
        servers.append(instance(hosts, "prefill", "prefill", 1, "--kv-transport", "mooncake"))
        d_extra = ["--kv-transport", "mooncake", "--kv-transfer-timeout", "20"]
        servers.append(instance(hosts, "decode", "decode", 1, *d_extra))
        p, d = servers
        routers.append(Router(hosts, p, d))
        free = metric(d, "num_kv_blocks_free")
        hosts.shape("prefill", "1mbit")
        try:
            outcome: list[Any] = []

            def client() -> None:
                try:
                    outcome.append(routers[0].complete(DEMO_PROMPTS[0] * 4))
                except Exception as exc:  # the expected end: the stream fails
                    outcome.append(exc)

            thread = threading.Thread(target=client)
            thread.start()
            deadline = time.monotonic() + 60
            while metric(p, "splitwise_handed_off_total") < 1:
                assert time.monotonic() < deadline, (
                    "the prefill instance never handed the request over"
                )
                time.sleep(0.05)
            time.sleep(0.3)  # the decode instance has started reading
            assert metric(d, "splitwise_kv_transfers_total") == 0, (
                "the transfer finished before the kill"
            )
            p.kill()
            thread.join(60)
            # its SysV queue, keyed on its own /dev/shm, went with it (the kill removes it)
            assert p.shm_stat is not None and not queues_with_id(p.queue_port)
        finally:
            hosts.shape("prefill", None)
        servers.remove(p)
        assert len(outcome) == 1 and isinstance(outcome[0], Exception), outcome
        seen = str(outcome[0])
        assert "KV transfer failed" in seen and "Mooncake read" in seen, seen
        assert f"from {hosts.addresses['prefill']}:" in seen, seen  # names the prefill host
        assert metric(d, 'splitwise_kv_transfer_failures_total{transport="mooncake"}') == 1
        deadline = time.monotonic() + 30
        while metric(d, "num_kv_blocks_free") != free:
            assert time.monotonic() < deadline, "the decode instance did not get its blocks back"
            time.sleep(0.2)
        assert d.reach(http_get, d.base_url + "/health")[0] == 200


def test_netns_each_host_discovers_its_own_address(hosts: Hosts) -> None:
    """On a network with no default route, the first address that is not loopback; the
    route towards another host starts from the same one."""
    from fastdeploy_mtp.splitwise.addresses import address_towards, discover_host

    for name in ("prefill", "decode"):
        assert hosts.call(name, discover_host) == hosts.addresses[name]
    assert (
        hosts.call("decode", address_towards, hosts.addresses["prefill"])
        == hosts.addresses["decode"]
    )


# ---- the bare transfer across the link --------------------------------------------------------

_SOURCE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from fastdeploy_mtp.splitwise.kv_layout import KVLayout
    from fastdeploy_mtp.splitwise.kv_source import KVSource
    from fastdeploy_mtp.models.cache_spec import describe, key_value_specs

    blocks, block_elems = int(sys.argv[1]), int(sys.argv[2])
    rng = np.random.default_rng(0)
    shape = (blocks, 2, block_elems // 16, 8)
    caches = [[rng.standard_normal(shape, dtype=np.float32) for _ in range(4)] for _ in range(2)]
    specs = key_value_specs("target", 1, shape, "float32")
    specs += key_value_specs("mtp", 1, shape, "float32")
    desc = describe(specs)
    released = lambda r, s: print("released", r, s, flush=True)
    layout = KVLayout.of_caches(caches, desc)
    source = KVSource(caches, layout, released, host="0.0.0.0", mooncake=True)
    ids = list(range(0, blocks, 2))
    print(json.dumps(source.offer("big", ids)), flush=True)
    sums = [float(c[ids].sum(dtype=np.float64)) for rank in caches for c in rank]
    print(json.dumps(sums), flush=True)
    sys.stdin.read()
    source.close()
    """
)

_PULL = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from fastdeploy_mtp.splitwise.kv_client import pull_blocks
    from fastdeploy_mtp.splitwise.kv_layout import KVLayout
    from fastdeploy_mtp.models.cache_spec import describe, key_value_specs

    transport, blocks, block_elems = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    descriptor = json.loads(sys.stdin.readline())
    n = len(descriptor["block_ids"])
    shape = (n + 3, 2, block_elems // 16, 8)
    caches = [[np.zeros(shape, np.float32) for _ in range(4)] for _ in range(2)]
    specs = key_value_specs("target", 1, shape, "float32")
    specs += key_value_specs("mtp", 1, shape, "float32")
    layout = KVLayout.of_caches(caches, describe(specs))
    t0 = time.perf_counter()
    moved = pull_blocks(descriptor, caches, layout, list(range(3, n + 3)), transport)
    seconds = time.perf_counter() - t0
    sums = [float(c[3:].sum(dtype=np.float64)) for rank in caches for c in rank]
    untouched = all(not c[:3].any() for rank in caches for c in rank)
    print(json.dumps({"bytes": moved, "seconds": seconds, "sums": sums, "untouched": untouched}),
          flush=True)
    """
)


@pytest.mark.parametrize("transport", ["mooncake", "tcp"])
def test_multihost_kv_source_to_pull_blocks_over_the_link(hosts: Hosts, transport: str) -> None:
    """64 MiB of blocks (2 ranks x 4 caches) offered on one host and pulled on another land
    exactly (every offered block's sum, nothing outside the destination blocks)."""
    blocks, block_elems = 512, 8192  # 32 KiB per block per cache; half the blocks offered
    source = subprocess.Popen(
        hosts.command(
            "prefill",
            [sys.executable, "-c", _SOURCE, str(blocks), str(block_elems)],
            private_shm=True,
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert source.stdout is not None and source.stdin is not None
        descriptor = source.stdout.readline()
        sums = json.loads(source.stdout.readline())
        assert json.loads(descriptor)["address"].startswith(f"tcp://{hosts.addresses['prefill']}:")
        pull = subprocess.run(
            hosts.command(
                "decode",
                [sys.executable, "-c", _PULL, transport, str(blocks), str(block_elems)],
                True,
            ),
            input=descriptor,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert pull.returncode == 0, pull.stderr[-3000:]
        result = json.loads(pull.stdout.strip().splitlines()[-1])
        assert result["bytes"] == 2 * 4 * (blocks // 2) * block_elems * 4 == 64 << 20
        assert result["sums"] == sums and result["untouched"]
        assert source.stdout.readline().split() == ["released", "big", "released"]
    finally:
        if source.stdin is not None:
            source.stdin.close()
        try:
            source.wait(30)
        except subprocess.TimeoutExpired:
            source.kill()
            source.wait(30)
