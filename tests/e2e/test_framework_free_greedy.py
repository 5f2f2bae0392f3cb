"""End-to-end greedy check of the MTP round without Paddle (tests/e2e/framework_free.py): the
package's own target step and proposer round (``fastdeploy_mtp.runtime.spec_step``, which
``TargetRunner`` and ``MTPProposer`` run on Paddle), through ``fastdeploy_mtp._kernels``
on each framework-free backend -- ``kernels-cpu``, ``cuda-emu``, ``xpu-emu`` and ``cuda``
(torch or CuPy tensors on a GPU) where usable.

For batches of 1 and 5 (one empty slot among them), K in {1, 3, 8}, num_model_steps in {1, K},
GREEDY and TARGET_MATCH verification, with and without EOS hits:

* the speculative output is plain greedy decoding of the target rule, token for token, and
  stops exactly where greedy decoding stops (EOS, or max_tokens);
* acceptance is real: more than one token per decoding step with an agreeing draft rule,
  exactly one (with drafts verified) with a draft rule that always disagrees;
* every verified draft chain is the MTP rule's chain, and the hidden rows the ops hand the
  MTP layer are the ones it expects (checked inside the loop);
* every step (drafts verified, tokens emitted) is identical to the ``kernels-cpu`` run.

Backend selection follows tests/conftest.py: ``FDMTP_TEST_BACKENDS=cuda`` runs only the named
backends and fails, instead of skipping, when one is unavailable (scripts/gpu_check.sh).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fastdeploy_mtp import _kernels
from fastdeploy_mtp.ops._op_wrappers import VerifyStrategy
from tests.e2e.framework_free import (
    FRAMEWORK_FREE_BACKENDS,
    FrameworkFreeMTP,
    NumpyBackend,
    Request,
    RunResult,
    ToyModels,
    greedy_reference,
    make_backend,
)
from tests.support.backends import required_backends, usable_or_skip

REPO = Path(__file__).resolve().parents[2]
_REQUIRED = required_backends()
# the Paddle backend (`cpu`) is not framework-free: a run restricted to it has nothing here
_BACKENDS = (
    [b for b in _REQUIRED if b in FRAMEWORK_FREE_BACKENDS]
    if _REQUIRED
    else list(FRAMEWORK_FREE_BACKENDS)
)


@pytest.fixture(params=_BACKENDS)
def ff_backend(request):
    return usable_or_skip(request.param, *make_backend(request.param))


@dataclass(frozen=True)
class Case:
    """One configuration. ``eos``: ``"hit"`` = EOS ids taken from the greedy outputs (two
    with several requests), so some requests stop early; ``"none"`` = an id no request generates."""

    prompts: tuple[tuple[int, ...], ...]
    max_tokens: tuple[int, ...]
    slots: tuple[int, ...]
    num_slots: int
    k: int
    steps: int
    eos: str = "none"
    draft: str = "agree"
    strategy: int = VerifyStrategy.GREEDY
    max_model_len: int = 48


FIVE = ((7, 3, 9, 1, 4), (2,), (30, 31, 32, 33, 34, 35, 36, 37, 38), (12, 5), (44, 8, 19))
CASES = {
    "b1-k1-s1": Case(((7, 3, 9, 1, 4),), (16,), (0,), 1, 1, 1),
    "b1-k3-s3-eos": Case(((2,),), (20,), (0,), 1, 3, 3, eos="hit"),
    "b5-k1-s1-eos": Case(FIVE, (12, 18, 5, 9, 14), (0, 2, 3, 4, 5), 6, 1, 1, eos="hit"),
    "b5-k3-s1-target_match": Case(
        FIVE, (10, 7, 16, 12, 3), (0, 1, 2, 3, 4), 5, 3, 1, strategy=VerifyStrategy.TARGET_MATCH
    ),
    "b5-k3-s3-eos": Case(FIVE, (12, 18, 5, 9, 14), (0, 2, 3, 4, 5), 6, 3, 3, eos="hit"),
    "b5-k3-s3-disagree": Case(
        FIVE, (8, 11, 6, 9, 13), (1, 2, 3, 4, 5), 6, 3, 3, eos="hit", draft="disagree"
    ),
    "b5-k8-s8-eos": Case(FIVE, (20, 24, 12, 18, 22), (0, 2, 3, 4, 5), 6, 8, 8, eos="hit"),
}


def _models(case: Case) -> ToyModels:
    return ToyModels.make(vocab=50, draft=case.draft, seed=7)


def _eos(case: Case, models: ToyModels) -> list[int]:
    free = [greedy_reference(models, p, m, ()) for p, m in zip(case.prompts, case.max_tokens)]
    if (
        case.eos == "hit"
    ):  # a token two thirds into the longest output (and the 3rd of the shortest)
        longest, shortest = max(free, key=len), min(free, key=len)
        return [longest[2 * len(longest) // 3]] + ([shortest[2]] if len(free) > 1 else [])
    unused = sorted(set(range(models.vocab)) - {t for out in free for t in out})
    return [unused[0]]


def _run(backend, case: Case) -> tuple[RunResult, list[list[int]], list[int]]:
    models = _models(case)
    eos = _eos(case, models)
    loop = FrameworkFreeMTP(
        backend, models, case.num_slots, case.k, case.steps, case.max_model_len, eos, case.strategy
    )
    requests = {
        s: Request(list(p), m) for s, p, m in zip(case.slots, case.prompts, case.max_tokens)
    }
    result = loop.run(requests)
    want = [greedy_reference(models, p, m, eos) for p, m in zip(case.prompts, case.max_tokens)]
    return result, want, eos


@functools.cache
def _kernels_cpu_run(case_id: str) -> RunResult:
    backend, reason = make_backend("kernels-cpu")
    assert backend is not None, reason
    return _run(backend, CASES[case_id])[0]


@pytest.mark.parametrize("case_id", list(CASES))
def test_speculative_decoding_equals_greedy_decoding(ff_backend, case_id):
    case = CASES[case_id]
    launches = _kernels._cuda_emulator_launches()
    result, want, eos = _run(ff_backend, case)
    if ff_backend.name == "cuda-emu":  # the CUDA kernels really ran under the emulator
        assert _kernels._cuda_emulator_launches() - launches >= 4 * len(result.steps)
    for i, (got, ref) in enumerate(zip(result.outputs, want)):
        assert got == ref, f"request {i} (slot {case.slots[i]}): speculative {got} != greedy {ref}"
    ended_by_eos = [len(o) < m and o[-1] in eos for o, m in zip(result.outputs, case.max_tokens)]
    if case.eos == "hit":
        assert any(ended_by_eos), "no request stopped at an EOS id"
        if len(case.prompts) > 1:
            assert not all(ended_by_eos), "every request stopped at an EOS id (max_tokens untested)"
    else:
        assert [len(o) for o in result.outputs] == list(case.max_tokens)

    accepted, drafted = np.array(result.accepted_per_decode()), np.array(result.drafts_per_decode())
    assert len(accepted) > len(case.prompts), "too few decoding steps to judge acceptance"
    assert (drafted <= case.steps).all() and (drafted == case.steps).any(), (
        f"drafts per decoding step {drafted.tolist()}: never all {case.steps} MTP substeps"
    )
    if case.draft == "agree":
        assert accepted.mean() > 1.5, f"tokens per decoding step {accepted.tolist()}"
        assert (accepted <= drafted + 1).all()
    else:  # every draft rejected: the target's own token only, although drafts were verified
        assert (accepted == 1).all(), f"tokens per decoding step {accepted.tolist()}"
        # (a request's last step or two near max_tokens has no room for drafts)
        assert (drafted > 0).mean() > 0.7, f"drafts per decoding step {drafted.tolist()}"

    if ff_backend.name != "kernels-cpu":
        reference = _kernels_cpu_run(case_id)
        assert result.outputs == reference.outputs
        assert len(result.steps) == len(reference.steps)
        for i, (a, b) in enumerate(zip(result.steps, reference.steps)):
            assert a == b, f"step {i} differs from kernels-cpu: {a} != {b}"


class _Corrupting(NumpyBackend):
    """kernels-cpu, except that after each call of ``op`` the rows (or, with ``axis=1``, the
    columns past the first) of its argument ``arg`` are rotated by one."""

    def __init__(self, op: str, arg: str, axis: int):
        super().__init__("kernels-cpu", contextlib.nullcontext)
        self.op, self.arg, self.axis = op, arg, axis

    def call(self, op, **kwargs):
        super().call(op, **kwargs)
        if op == self.op:
            buf = kwargs[self.arg]
            if self.axis == 0:
                buf[:] = np.roll(buf, 1, axis=0)
            else:
                buf[:, 1:] = np.roll(buf[:, 1:], 1, axis=1)


@pytest.mark.only_backend("kernels-cpu")
@pytest.mark.parametrize(
    "op,arg,axis,message",
    [
        ("eagle_get_hidden_states", "out", 0, "the hidden row embeds token"),
        ("eagle_gather_hidden_states", "out", 0, "gathered row 0 is not slot"),
        (
            "draft_model_postprocess",
            "base_model_draft_tokens",
            1,
            "are not a prefix of the MTP chain",
        ),
    ],
)
def test_the_loop_notices_misplaced_rows(op, arg, axis, message):
    """The loop's own checks are not vacuous: hidden rows or drafts an op put in the wrong
    place fail it (the drafts one although the output would still be greedy)."""
    with pytest.raises(AssertionError, match=message):
        _run(_Corrupting(op, arg, axis), CASES["b5-k3-s3-eos"])


@pytest.mark.only_backend("kernels-cpu")
def test_the_loop_runs_where_paddle_cannot_be_imported(tmp_path):
    """The loop, its backends and the package's op sequences import and run with Paddle made
    unimportable (as on the GPU check machine): a fake ``paddle`` package that raises on
    import comes first on the path."""
    fake = tmp_path / "paddle"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        'raise ModuleNotFoundError("paddle is disabled for this test")\n'
    )
    code = (
        "import sys\n"
        "from tests.e2e.test_framework_free_greedy import CASES, _run\n"
        "from tests.e2e.framework_free import make_backend\n"
        "backend, reason = make_backend('kernels-cpu')\n"
        "assert backend is not None, reason\n"
        "result, want, _ = _run(backend, CASES['b5-k3-s3-eos'])\n"
        "assert result.outputs == want\n"
        "assert 'paddle' not in sys.modules\n"
        "assert 'fastdeploy_mtp.runtime.spec_step' in sys.modules"
        "  # the package's op sequences ran\n"
        "print('ok', len(result.steps))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok "), proc.stdout
