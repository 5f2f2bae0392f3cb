"""Shared fixtures. `backend` runs each op test on every backend: `cpu` (Paddle op),
`kernels-cpu` (framework-free module), `xpu-emu` (the XPU3 kernels under the emulator) and
`cuda` where a GPU is usable; an unusable backend is reported as skipped with its reason.
`cuda-emu` (the CUDA kernels under the CUDA emulator) runs when named in
FDMTP_TEST_BACKENDS (CI has a line for it).

FDMTP_TEST_BACKENDS=cuda (comma-separated names) restricts the run to those backends and
turns "unavailable" into a failure, so a GPU check cannot pass by skipping.

Every test marked ``slow`` here (by its module, :data:`SLOW`) is left out of the quick tier,
``pytest -m "not slow"``. Under ``pytest -n N --dist loadfile`` (pytest-xdist) the tests of
one module run on one worker, in order (so a module's server starts once), except in the
modules of :data:`SPREAD`, whose tests are long and share no server: their tests are spread
over the workers one by one (:func:`pytest_xdist_make_scheduler`).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

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


TESTS = Path(__file__).parent

#: The slow tests, by module (a path under tests/; a folder ends in "/"): they start servers
#: or many processes, compare against transformers, build, fuzz, or run whole engines
#: (a few seconds and more each; the rest, ~2,700 tests, runs in about 30 s on 2 cores).
SLOW = (
    "serving/",
    "e2e/",
    "fuzz/",
    "checks/test_check_drafts_cli.py",
    "checks/test_eos_from_folder.py",
    "models/test_draft_fidelity.py",
    "models/test_shipped_mla_checkpoint.py",
    "models/test_shipped_checkpoint.py",
    "models/test_folder_writer.py",
    "models/test_families.py",
    "models/test_model_folder.py",
    "models/test_ernie.py",
    "models/test_hybrid_engine.py",
    "models/test_mla_deepseek.py",
    "models/test_moe_glm.py",
    "models/test_hybrid_families.py",
    "models/test_tensor_parallel.py",
    "models/test_train_tiny.py",
    "ops/test_build.py",
    "ops/test_messaging.py",
    "ops/test_ipc_xpu.py",
    "ops/test_xpu_emulator.py",
    "proposer/test_kv_cache_ipc.py",
    "proposer/test_depth_consistency.py",
    "proposer/test_draft_methods.py",
    "runtime/test_prefix_caching.py",
    "runtime/test_tensor_parallel_engine.py",
    "runtime/test_ipc_processes.py",
    "runtime/test_token_budget.py",
    "runtime/test_guided.py",
    "splitwise/test_handoff_engine.py",
    "splitwise/test_mooncake_transfer.py",
    "splitwise/test_mooncake_deployed.py",
    "splitwise/test_kv_transfer.py",
    "support/test_hf_folders.py",
    "tokenization/test_detokenizer.py",
    "tokenization/test_byte_tokenizer.py",
    "test_cli.py",
    "test_integration_doc.py",
    "test_readme.py",
)

#: Modules whose tests a parallel run spreads over its workers: each test is long and builds
#: what it needs itself (a folder, a reference, an engine or a server of its own), in any order.
SPREAD = (
    "models/test_draft_fidelity.py",
    "serving/test_family_drafts_serving.py",
    "checks/test_check_drafts_cli.py",
)


def _module(item: pytest.Item) -> str:
    """The test's module as a path under tests/ (``serving/test_server.py``)."""
    return item.path.relative_to(TESTS).as_posix()


def _listed(module: str, paths: tuple[str, ...]) -> bool:
    return any(module == p or (p.endswith("/") and module.startswith(p)) for p in paths)


#: The math libraries' thread pools (Paddle's and torch's OpenMP / MKL / OpenBLAS).
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def pytest_configure(config):
    """Under ``pytest -n N`` the workers (started after this, with this environment) share
    the cores: each worker's math libraries run one thread unless told otherwise, so N
    workers do not run N times as many threads as there are cores (on 2 cores this takes
    about a seventh off the suite's time)."""
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        for var in THREAD_VARS:
            os.environ.setdefault(var, "1")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook (unknown without the plugin)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``: a module is one unit of work (one worker runs its tests in order),
    a test of a :data:`SPREAD` module a unit of its own. (``xdist_group`` marks cannot say it:
    pytest 9.2 drops the group that ``--dist loadgroup`` writes into the node id.)"""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return nodeid if _listed(module.removeprefix("tests/"), SPREAD) else module

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Marks the slow tests (see the module docstring). With FDMTP_TEST_BACKENDS set, a test
    that runs on one named backend only (``@pytest.mark.only_backend("cuda")``) is deselected
    unless that backend is required: it is not this run's business, and skipping it would
    hide the run's real skips."""
    for item in items:
        if _listed(_module(item), SLOW):
            item.add_marker(pytest.mark.slow)
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
