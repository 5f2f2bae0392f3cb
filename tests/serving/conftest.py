"""Servers several serving test modules share (each module starts its own: the fixtures
are module-scoped)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servers import ServerProcess, serving

#: three MTP draft tokens a round, three MTP steps
MTP3 = '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 3}'
NO_SPEC = '{"method": null}'


@pytest.fixture(scope="module")
def spec_server() -> Iterator[ServerProcess]:
    """``serve`` with MTP (K=3), 4 slots."""
    yield from serving(["--speculative-config", MTP3, "--max-num-seqs", "4"])


@pytest.fixture(scope="module")
def plain_server() -> Iterator[ServerProcess]:
    """``serve`` without speculation, 4 slots."""
    yield from serving(["--speculative-config", NO_SPEC, "--max-num-seqs", "4"])
