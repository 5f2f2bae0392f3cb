"""A checkpoint with three distinct MTP layers, served through the real process layout at
tensor-parallel size 2: the cache manager creates every cache of the model's cache spec (2
target + 3 MTP layers, a key and a value each, per rank), the workers attach all of them, and
a prefill instance hands every one of them to a decode instance over both KV transports.
Every output equals the in-process engine's on the same checkpoint."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
from tests.support.handover import handed_over_every_cache
from tests.support.servers import (
    ServerProcess,
    http_post,
    splitwise_instances as instances,
    splitwise_router as router,
    stopped_cleanly,
)

MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3}'
TP2 = ("--tensor-parallel-size", "2")
MAX_TOKENS = 24
TARGET_LAYERS, MTP_LAYERS = 2, 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: Any) -> str:
    """The shipped target with three MTP layers: layer 0 the shipped MTP layer, layers 1 and
    2 copies of it with their weights scaled by seeded noise (10 % and 20 %), so the three
    draft differently and each needs its own cache."""
    from fastdeploy_mtp.models import load_tiny, save_tiny
    from fastdeploy_mtp.models.mtp_layer import MTPStack

    target, mtp, arch = load_tiny()
    arch3 = type(arch).from_dict({**arch.to_dict(), "num_nextn_predict_layers": MTP_LAYERS})
    stack = MTPStack(arch3, target)
    shipped = dict(mtp.named_parameters())
    rng = np.random.default_rng(3)
    for i, layer in enumerate(stack.layers):
        for name, p in layer.named_parameters():
            value = shipped[name].numpy()
            p.set_value(
                (value * (1 + 0.1 * i * rng.standard_normal(value.shape))).astype(np.float32)
            )
    path = str(tmp_path_factory.mktemp("mtp3-checkpoint"))
    save_tiny(path, target, stack, arch3)
    return path


@pytest.fixture(scope="module")
def expected(checkpoint: str) -> list[str]:
    """The in-process engine's greedy texts on the checkpoint."""
    from fastdeploy_mtp.config import SpeculativeConfig
    from fastdeploy_mtp.entrypoints.offline import run_prompts

    texts, _, metrics = run_prompts(
        DEMO_PROMPTS, MAX_TOKENS, SpeculativeConfig.from_json(MTP3), 8, "reference", checkpoint
    )
    assert all(
        a is not None and a > 0 for a in metrics.acceptance_per_position
    )  # every layer drafts
    return texts


def complete_all(url: str, prompts: list[str]) -> list[str]:
    """Every prompt at once (greedy, ``MAX_TOKENS`` each); the texts in prompt order."""

    def one(prompt: str) -> str:
        status, body = http_post(
            url + "/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS}, timeout=120
        )
        assert status == 200, body
        return body["choices"][0]["text"]

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def test_serve_at_tp_2_creates_and_attaches_every_mtp_layers_caches(
    checkpoint: str, expected: list[str]
) -> None:
    srv = ServerProcess(["--model", checkpoint, "--speculative-config", MTP3, *TP2])
    try:
        assert len(srv.worker_pids()) == 2
        assert complete_all(srv.base_url, DEMO_PROMPTS) == expected
        log = srv.output()
    except BaseException:
        srv.kill()
        raise
    stopped_cleanly(srv)
    for rank in (0, 1):
        assert f"rank {rank}: 10 KV caches published (4 target + 6 MTP, float32," in log, log


def test_prefill_hands_every_cache_of_every_rank_to_decode_over_shm_and_tcp(
    checkpoint: str, expected: list[str]
) -> None:
    model = ("--model", checkpoint)
    with instances(
        ("prefill", MTP3, *model, *TP2),
        ("decode", MTP3, *model, *TP2, "--kv-transport", "shm"),
        ("decode", MTP3, *model, *TP2, "--kv-transport", "tcp"),
    ) as (p, shm, tcp):
        for d in (shm, tcp):
            with router(p, d) as url:
                assert complete_all(url, DEMO_PROMPTS) == expected
            handed_over_every_cache(
                p.base_url,
                d.base_url,
                f"count-{'shm' if d is shm else 'tcp'}",
                list(b"Paged KV caches: "),
                target_layers=TARGET_LAYERS,
                mtp_layers=MTP_LAYERS,
                tensor_parallel_size=2,
            )
