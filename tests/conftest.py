"""Shared fixtures. `backend` runs each op test on every backend: `cpu` (Paddle op),
`kernels-cpu` (framework-free module), `xpu-emu` (the XPU3 kernels under the emulator) and
`cuda` where a GPU is usable; an unusable backend is reported as skipped with its reason.
`cuda-emu` (the CUDA kernels under the CUDA emulator) runs when named in
FDMTP_TEST_BACKENDS (CI has a line for it).

FDMTP_TEST_BACKENDS=cuda (comma-separated names) restricts the run to those backends and
turns "unavailable" into a failure, so a GPU check cannot pass by skipping.
"""

from __future__ import annotations

import os
import secrets

import pytest

from fastdeploy_mtp.credentials import SECRET_ENV
from tests.support.backends import (
    ALL_BACKENDS,
    DEFAULT_BACKENDS,
    availability,
    required_backends,
    usable_or_skip,
)

# One splitwise secret for the whole run, inherited by every instance and router the tests
# start (so no test writes the per-user default secret file).
os.environ.setdefault(SECRET_ENV, secrets.token_hex(32))

_REQUIRED = required_backends()
for _name in _REQUIRED:
    if _name not in ALL_BACKENDS:
        raise pytest.UsageError(
            f"FDMTP_TEST_BACKENDS: unknown backend {_name!r}; known: {ALL_BACKENDS}"
        )


def pytest_collection_modifyitems(config, items):
    """With FDMTP_TEST_BACKENDS set, a test that runs on one named backend only
    (``@pytest.mark.only_backend("cuda")``) is deselected unless that backend is required:
    it is not this run's business, and skipping it would hide the run's real skips."""
    if not _REQUIRED:
        return
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("only_backend")
        (drop if marker is not None and marker.args[0] not in _REQUIRED else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(params=_REQUIRED or list(DEFAULT_BACKENDS))
def backend(request):
    return usable_or_skip(request.param, *availability(request.param))


@pytest.fixture(scope="session")
def random_model():
    """(target, mtp) with random weights: see tests/support/engines.py."""
    from tests.support.engines import build_random_model

    return build_random_model()
