"""A framework-free MTP speculative decoding loop: the package's own op sequences of the
target step and of the proposer's round (:mod:`fastdeploy_mtp.runtime.spec_step`, which
``TargetRunner.execute`` and ``MTPProposer.run`` run on Paddle tensors), driven here through
``fastdeploy_mtp._kernels`` on a pluggable array backend, with tiny numpy "models".

It needs no Paddle, so the same end-to-end greedy check runs on the framework-free CPU build,
under the CUDA and XPU emulators, and on a real GPU with torch (or CuPy) tensors.

The seam: an :class:`ArrayBackend` is the package's ``StepBackend`` (``run_op`` allocates the
outputs the Paddle wrappers would allocate and calls ``_kernels``; ``host``, ``stage``,
``float32``), and :class:`FrameworkFreeMTP` is its ``TargetStepModel`` and ``DraftStepModel``
(the toy forwards, logits and greedy sampling). The backends live here, not in the package:
they exist only to test the kernels end to end, pick torch or CuPy the way the op tests do
(``tests/support/backends.py``), and the package never runs without Paddle.

One step, as the engine runs it:

* target (``target_step``): ``speculate_pre_process`` -> target model (host) ->
  ``verify_draft_tokens`` (GREEDY or TARGET_MATCH) -> ``unified_update_model_status``;
* proposer (``prepare_round``, ``propose_substeps``, ``postprocess``):
  ``draft_model_preprocess`` -> ``eagle_get_hidden_states`` -> ``num_model_steps`` x
  (``speculate_pre_process`` -> MTP model (host) -> ``eagle_gather_hidden_states`` -> draft
  logits (host) -> ``draft_model_update``) -> ``draft_model_postprocess``.

Buffers keep the engine's names, shapes, dtypes and sharing (the proposer's ``accept_tokens``,
``accept_num``, ``max_dec_len``, ``eos_token_id`` and ``base_model_draft_tokens`` are the
target's arrays). They stay on the backend between steps; the host reads only what a model
consumes (its packed input ids, hidden rows and the lengths its attention would read), what
the runner reads (each step's ``seq_lens_this_time`` / ``seq_lens_encoder``, the drafts it
verifies) and what the engine collects (accepted tokens, counts, stop flags). The host writes
only what the engine writes: a request's slot at insertion, a finished slot's reset, and the
models' outputs (hidden rows, target tokens, sampled drafts).

The models (:class:`ToyModels`): the target's next token after ``(prev, cur)`` is
``target_table[prev, cur]`` (row ``V`` when there is no previous token). A hidden row is
``[emb(input token), emb(predicted token)]``; logits read the second half. The MTP layer at
draft position ``q`` gets token ``t[q + 1]`` with a hidden row whose first half must be
``emb(t[q])`` -- the token its own KV cache holds at ``q - 1`` -- and predicts
``draft_table[t[q], t[q + 1]]``. Both models keep a token "KV cache" per slot written at
``seq_lens_decoder + i``, so wrong lengths, rows or hidden states from the ops change tokens
or fail an assertion instead of going unnoticed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from fastdeploy_mtp import _kernels
from fastdeploy_mtp.constants import PLACEHOLDER_TOKEN_ID
from fastdeploy_mtp.ops._op_wrappers import VerifyStrategy
from fastdeploy_mtp.runtime.spec_step import (
    LogitRows,
    Packed,
    postprocess,
    prepare_round,
    propose_substeps,
    target_step,
)

#: The framework-free backends, by their op-test names (tests/support/backends.py).
FRAMEWORK_FREE_BACKENDS = ("kernels-cpu", "cuda-emu", "xpu-emu", "cuda")

# ---------------------------------------------------------------------------------------------
# Array backends
# ---------------------------------------------------------------------------------------------


class ArrayBackend:
    """Where the op buffers live and how an op is called on them. Arrays are whatever the
    backend holds (numpy arrays, torch or CuPy CUDA tensors); the loop only creates them
    from host arrays, reads them back, copies leading rows and writes host values."""

    name = ""

    def array(self, host: np.ndarray) -> Any:
        """A backend copy of the host array ``host`` (same shape and dtype)."""
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A backend array for an op output (filled with a 0xA5 byte pattern on the host
        first, so rows an op forgets to write are not zero by accident)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.array(np.full(nbytes, 0xA5, np.uint8).view(dtype).reshape(shape))

    def host(self, arr: Any, rows: int | None = None) -> np.ndarray:
        """A host copy of ``arr`` (its first ``rows`` rows if given)."""
        raise NotImplementedError

    def copy_rows(self, dst: Any, src: Any, rows: int) -> None:
        """``dst[:rows] = src[:rows]`` on the backend."""
        raise NotImplementedError

    def write(self, arr: Any, index: Any, value: Any) -> None:
        """``arr[index] = value`` with a host value (a scalar or a numpy array)."""
        raise NotImplementedError

    def call(self, op: str, **kwargs: Any) -> None:
        """``_kernels.<op>(**kwargs)`` on this backend's arrays."""
        raise NotImplementedError

    # ---- the package's StepBackend seam (fastdeploy_mtp.runtime.spec_step) --------------------
    def float32(self, arr: Any) -> Any:
        """The toy models' hidden rows are float32 already."""
        return arr

    def stage(self, dst: Any, src: Any) -> None:
        self.copy_rows(dst, src, int(src.shape[0]))

    def run_op(self, name: str, **kwargs: Any) -> Any:
        """Op ``name`` as its Paddle wrapper behaves: the outputs the wrapper would allocate
        are allocated here (:meth:`empty`), passed to ``_kernels`` and returned in the
        wrapper's order; an op without new outputs returns None."""
        outputs = self._outputs(name, kwargs)
        self.call(name, **kwargs, **outputs)
        return tuple(outputs.values()) if outputs else None

    def _outputs(self, name: str, kw: dict[str, Any]) -> dict[str, Any]:
        """The new outputs of the ops the step runs (shapes as ``_kernels``' docstrings)."""
        if name == "speculate_pre_process":
            t, n, w = (
                kw["cpu_token_num"],
                int(kw["seq_len"].shape[0]),
                int(kw["draft_tokens"].shape[1]),
            )
            return {
                "ids_remove_padding": self.empty((t,), np.int64),
                "batch_id_per_token": self.empty((t,), np.int32),
                "cu_seqlens_q": self.empty((n + 1,), np.int32),
                "cu_seqlens_k": self.empty((n + 1,), np.int32),
                "cu_seq_lens_q_output": self.empty((n + 1,), np.int32),
                "batch_id_per_token_output": self.empty((n * w,), np.int32),
                "real_output_token_num": self.empty((1,), np.int32),
            }
        if name in ("eagle_get_hidden_states", "eagle_gather_hidden_states"):
            rows = (
                kw["input"].shape[0]
                if name == "eagle_get_hidden_states"
                else kw["seq_lens_this_time"].shape[0]
            )
            shape = (int(rows), int(kw["input"].shape[1]))
            return {
                "out": self.empty(shape, np.float32),
                "output_token_num": self.empty((1,), np.int32),
            }
        return {}


class NumpyBackend(ArrayBackend):
    """Host numpy arrays; every op call runs inside ``scope()`` (an emulator, or nothing)."""

    def __init__(self, name: str, scope: Callable[[], contextlib.AbstractContextManager[Any]]):
        self.name = name
        self._scope = scope

    def array(self, host: np.ndarray) -> np.ndarray:
        return np.array(host, copy=True)

    def host(self, arr: np.ndarray, rows: int | None = None) -> np.ndarray:
        return np.array(arr if rows is None else arr[:rows], copy=True)

    def copy_rows(self, dst: np.ndarray, src: np.ndarray, rows: int) -> None:
        dst[:rows] = src[:rows]

    def write(self, arr: np.ndarray, index: Any, value: Any) -> None:
        arr[index] = value

    def call(self, op: str, **kwargs: Any) -> None:
        with self._scope():
            getattr(_kernels, op)(**kwargs)


class TorchCudaBackend(ArrayBackend):
    """torch CUDA tensors; ops are launched on torch's current stream."""

    name = "cuda"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def array(self, host: np.ndarray) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(host)).cuda()

    def host(self, arr: Any, rows: int | None = None) -> np.ndarray:
        return (arr if rows is None else arr[:rows]).cpu().numpy()

    def copy_rows(self, dst: Any, src: Any, rows: int) -> None:
        dst[:rows].copy_(src[:rows])

    def write(self, arr: Any, index: Any, value: Any) -> None:
        arr[index] = self.torch.as_tensor(np.asarray(value)).to(device=arr.device, dtype=arr.dtype)

    def call(self, op: str, **kwargs: Any) -> None:
        getattr(_kernels, op)(**kwargs, stream=self.torch.cuda.current_stream().cuda_stream)


class CupyCudaBackend(ArrayBackend):
    """CuPy CUDA arrays; ops are launched on CuPy's current stream."""

    name = "cuda"

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy

    def array(self, host: np.ndarray) -> Any:
        return self.cupy.asarray(np.ascontiguousarray(host))

    def host(self, arr: Any, rows: int | None = None) -> np.ndarray:
        return self.cupy.asnumpy(arr if rows is None else arr[:rows])

    def copy_rows(self, dst: Any, src: Any, rows: int) -> None:
        dst[:rows] = src[:rows]

    def write(self, arr: Any, index: Any, value: Any) -> None:
        arr[index] = self.cupy.asarray(np.asarray(value, dtype=arr.dtype))

    def call(self, op: str, **kwargs: Any) -> None:
        getattr(_kernels, op)(**kwargs, stream=self.cupy.cuda.get_current_stream().ptr)


def make_backend(name: str) -> tuple[ArrayBackend | None, str]:
    """(backend, "") if the framework-free backend ``name`` is usable here, else (None, the
    reason it is not). Availability is decided as for the op tests (tests/support/backends.py)."""
    from tests.support.backends import availability

    if name not in FRAMEWORK_FREE_BACKENDS:
        raise ValueError(f"`name` must be one of {FRAMEWORK_FREE_BACKENDS}, got {name!r}")
    impl, reason = availability(name)
    if impl is None:
        return None, reason
    if name == "kernels-cpu":
        return NumpyBackend(name, contextlib.nullcontext), ""
    if name == "cuda-emu":
        return NumpyBackend(name, lambda: _kernels.cuda_emulation(0)), ""
    if name == "xpu-emu":
        return NumpyBackend(name, lambda: _kernels.xpu_emulation(3, 16)), ""
    return (TorchCudaBackend() if getattr(impl, "lib", "") == "torch" else CupyCudaBackend()), ""


# ---------------------------------------------------------------------------------------------
# Toy models
# ---------------------------------------------------------------------------------------------


@dataclass
class ToyModels:
    """The target and MTP "models": next-token tables over the last two tokens and a token
    embedding (see the module docstring).

    Attributes:
        target_table: ``[V + 1, V]`` int64, the target's next token after ``(prev, cur)``;
            row ``V`` = no previous token.
        draft_table: ``[V + 1, V]`` int64, the MTP layer's prediction for the same pair.
        emb: ``[V, E]`` float32, distinct rows; hidden rows are ``[T, 2E]`` float32.
    """

    target_table: np.ndarray
    draft_table: np.ndarray
    emb: np.ndarray
    _rows: dict[bytes, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rows = {row.tobytes(): t for t, row in enumerate(self.emb)}
        if len(self._rows) != len(self.emb):
            raise ValueError("`emb` rows must be distinct")

    @property
    def vocab(self) -> int:
        return int(self.emb.shape[0])

    @property
    def hidden_size(self) -> int:
        return 2 * int(self.emb.shape[1])

    @classmethod
    def make(
        cls, vocab: int = 50, emb_dim: int = 3, draft: str = "agree", seed: int = 0
    ) -> ToyModels:
        """Random tables over ``vocab`` tokens. ``draft``: ``"agree"`` = the target's table with
        about 1 entry in 8 changed, ``"disagree"`` = never the target's token."""
        rng = np.random.default_rng(seed)
        target = rng.integers(0, vocab, size=(vocab + 1, vocab), dtype=np.int64)
        if draft == "agree":
            wrong = rng.random(target.shape) < 0.125
            drafted = np.where(
                wrong, (target + 1 + rng.integers(0, vocab - 1, target.shape)) % vocab, target
            )
        elif draft == "disagree":
            drafted = (target + 1) % vocab
        else:
            raise ValueError(f"`draft` must be 'agree' or 'disagree', got {draft!r}")
        emb = rng.standard_normal((vocab, emb_dim)).astype(np.float32)
        return cls(target, drafted.astype(np.int64), emb)

    def next_token(self, table: np.ndarray, prev: int, cur: int) -> int:
        return int(table[prev if prev >= 0 else self.vocab, cur])

    def token_of(self, vec: np.ndarray, what: str) -> int:
        """The token whose embedding is exactly ``vec`` (``[E]`` float32)."""
        tok = self._rows.get(np.ascontiguousarray(vec, np.float32).tobytes())
        if tok is None:
            raise AssertionError(f"{what} is not a token embedding: {vec.tolist()}")
        return tok

    def row(self, token: int, predicted: int) -> np.ndarray:
        return np.concatenate([self.emb[token], self.emb[predicted]])

    def logits_token(self, hidden_row: np.ndarray, what: str) -> int:
        """The "argmax" of a hidden row: the token its second half embeds."""
        return self.token_of(hidden_row[self.hidden_size // 2 :], what)


def greedy_reference(
    models: ToyModels, prompt: Sequence[int], max_tokens: int, eos: Sequence[int]
) -> list[int]:
    """Plain greedy decoding with the target table: up to ``max_tokens`` tokens, the first
    EOS id included and last."""
    seq, out = list(prompt), list[int]()
    while len(out) < max_tokens:
        tok = models.next_token(models.target_table, seq[-2] if len(seq) > 1 else -1, seq[-1])
        seq.append(tok)
        out.append(tok)
        if tok in eos:
            break
    return out


def _packed_rows(cu: np.ndarray, slt: np.ndarray) -> list[tuple[int, int, int]]:
    """``(item, first row, rows)`` of every item with rows, checking the prefix sums."""
    expected = np.concatenate([[0], np.cumsum(np.maximum(slt, 0))])
    if not np.array_equal(cu[: len(expected)], expected):
        raise AssertionError(
            f"cu_seqlens_q {cu.tolist()} != prefix sums of seq_lens_this_time {slt.tolist()}"
        )
    return [(b, int(cu[b]), int(slt[b])) for b in range(len(slt)) if slt[b] > 0]


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


@dataclass
class Request:
    """A prompt and its generation limit."""

    prompt: list[int]
    max_tokens: int


@dataclass
class StepRecord:
    """What one step did, on the host (the cross-backend comparison covers all of it).

    Attributes:
        decoding: slots that decoded (not prefill) this step.
        drafts: ``{slot: drafts the target verified}`` for decoding slots.
        emitted: ``{slot: tokens emitted}`` for every slot that ran.
    """

    decoding: list[int]
    drafts: dict[int, list[int]]
    emitted: dict[int, list[int]]


@dataclass
class RunResult:
    """A finished run: per-request outputs and the step trace."""

    outputs: list[list[int]]
    steps: list[StepRecord]

    def accepted_per_decode(self) -> list[int]:
        """Tokens emitted by every decoding slot in every step."""
        return [len(s.emitted[b]) for s in self.steps for b in s.decoding]

    def drafts_per_decode(self) -> list[int]:
        """Drafts verified for every decoding slot in every step."""
        return [len(s.drafts[b]) for s in self.steps for b in s.decoding]


class FrameworkFreeMTP:
    """The reference engine's step and the MTP proposer's round on a framework-free backend.

    Args:
        backend: where the buffers live (:func:`make_backend`).
        models: the toy target and MTP models.
        num_slots: ``N``, slots (``max_num_seqs``).
        num_speculative_tokens: ``K`` (>= 1); draft rows are ``W = K + 1`` wide.
        num_model_steps: MTP substeps per round, ``1 <= S <= K``.
        max_model_len: ``L``, history length; a request needs ``prompt + max_tokens + K + 1 <= L``.
        eos: EOS ids (``eos_token_id``, ``[E, 1]``).
        verify_strategy: ``VerifyStrategy.GREEDY`` or ``VerifyStrategy.TARGET_MATCH``.
    """

    def __init__(
        self,
        backend: ArrayBackend,
        models: ToyModels,
        num_slots: int,
        num_speculative_tokens: int,
        num_model_steps: int,
        max_model_len: int,
        eos: Sequence[int],
        verify_strategy: int = VerifyStrategy.GREEDY,
    ):
        if num_speculative_tokens < 1:
            raise ValueError(f"`num_speculative_tokens` must be >= 1, got {num_speculative_tokens}")
        if not 1 <= num_model_steps <= num_speculative_tokens:
            raise ValueError(
                f"`num_model_steps` must be in [1, {num_speculative_tokens}], got {num_model_steps}"
            )
        if verify_strategy not in (VerifyStrategy.GREEDY, VerifyStrategy.TARGET_MATCH):
            raise ValueError(
                f"`verify_strategy` must be GREEDY or TARGET_MATCH, got {verify_strategy}"
            )
        if not eos:
            raise ValueError("`eos` must name at least one EOS id")
        self.be, self.models = backend, models
        self.n, self.k, self.steps, self.max_len = (
            num_slots,
            num_speculative_tokens,
            num_model_steps,
            max_model_len,
        )
        self.eos = [int(e) for e in eos]
        self.strategy = int(verify_strategy)
        n, w, seq_len, be = num_slots, num_speculative_tokens + 1, max_model_len, backend

        def full(shape: tuple[int, ...], value: Any, dtype: Any) -> Any:
            return be.array(np.full(shape, value, dtype))

        # the target's share_inputs (the buffers these ops touch), FastDeploy's names
        t = SimpleNamespace()
        t.input_ids = full((n, seq_len), PLACEHOLDER_TOKEN_ID, np.int64)
        t.token_ids_all = full((n, seq_len), PLACEHOLDER_TOKEN_ID, np.int64)
        t.prompt_lens = full((n, 1), 0, np.int64)
        t.seq_lens_this_time = full((n,), 0, np.int32)
        t.seq_lens_encoder = full((n,), 0, np.int32)
        t.seq_lens_decoder = full((n,), 0, np.int32)
        t.step_idx = full((n, 1), 0, np.int64)
        t.stop_flags = full((n, 1), True, np.bool_)
        t.is_block_step = full((n,), False, np.bool_)
        t.draft_tokens = full((n, w), PLACEHOLDER_TOKEN_ID, np.int64)
        t.accept_tokens = full((n, w), PLACEHOLDER_TOKEN_ID, np.int64)
        t.accept_num = full((n,), 0, np.int32)
        t.max_dec_len = full((n, 1), 0, np.int64)
        t.eos_token_id = be.array(np.asarray(self.eos, np.int64).reshape(-1, 1))
        t.not_need_stop = full((1,), False, np.bool_)
        t.top_p = full((n, 1), 1.0, np.float32)
        t.reasoning_status = full((n, 1), 0, np.int32)
        self.t = t
        # the proposer's model_inputs: shared (the same arrays), cloned, and its own
        d = SimpleNamespace()
        for own, theirs in (
            ("max_dec_len", "max_dec_len"),
            ("eos_token_id", "eos_token_id"),
            ("base_model_draft_tokens", "draft_tokens"),
            ("accept_num", "accept_num"),
            ("accept_tokens", "accept_tokens"),
        ):
            setattr(d, own, getattr(t, theirs))
        for name in ("input_ids", "seq_lens_encoder", "seq_lens_decoder", "step_idx"):
            setattr(d, name, be.array(be.host(getattr(t, name))))
        d.seq_lens_this_time = full((n,), 0, np.int32)
        d.stop_flags = full((n, 1), True, np.bool_)
        d.draft_tokens = full((n, w), PLACEHOLDER_TOKEN_ID, np.int64)
        d.pre_ids = full((n, seq_len), PLACEHOLDER_TOKEN_ID, np.int64)
        d.not_need_stop = full((1,), False, np.bool_)
        self.d = d
        d.target_hidden_states = None  # sized by the first step: see step()
        # the models' token "KV caches" per slot, and the requests
        self.target_cache = np.full((n, seq_len), -1, np.int64)
        self.mtp_cache = np.full((n, seq_len), -1, np.int64)
        self.requests: dict[int, Request] = {}
        self.outputs: dict[int, list[int]] = {}
        self.done: set[int] = set()
        # what a forward leaves for the logits after it (host): the target's next tokens ([T]
        # int64), the MTP substep's output rows ([T, 2E] float32), its cu_seqlens_q ([N + 1])
        # and its seq_lens_this_time ([N] int64, read before draft_model_update changes it)
        self._next_tokens = np.zeros(0, np.int64)
        self._mtp_out = np.zeros((0, models.hidden_size), np.float32)
        self._cu = np.zeros(num_slots + 1, np.int32)
        self._dslt = np.zeros(num_slots, np.int64)

    # ---- insertion and release (host writes, as the engine's) ----------------------------------
    def insert(self, slot: int, req: Request) -> None:
        """Load ``req`` into ``slot`` as one prefill chunk (``TargetRunner.insert_tasks`` and
        ``MTPProposer.insert_tasks_v1`` for a whole prompt)."""
        if not 0 <= slot < self.n or slot in self.requests:
            raise ValueError(f"`slot` must be a free slot in [0, {self.n}), got {slot}")
        p = len(req.prompt)
        if p == 0 or req.max_tokens <= 0 or p + req.max_tokens + self.k + 1 > self.max_len:
            raise ValueError(
                f"request in slot {slot}: prompt {p} + max_tokens {req.max_tokens} + K + 1 must "
                f"fit max_model_len {self.max_len} (and both be > 0)"
            )
        be, t, d = self.be, self.t, self.d
        prompt = np.asarray(req.prompt, np.int64)
        be.write(t.input_ids, (slot, slice(0, p)), prompt)
        be.write(t.token_ids_all, slot, PLACEHOLDER_TOKEN_ID)
        be.write(t.token_ids_all, (slot, slice(0, p)), prompt)
        be.write(t.prompt_lens, (slot, 0), p)
        be.write(t.seq_lens_encoder, slot, p)
        be.write(t.seq_lens_decoder, slot, 0)
        be.write(t.seq_lens_this_time, slot, p)
        be.write(t.step_idx, (slot, 0), 0)
        be.write(t.stop_flags, (slot, 0), False)
        be.write(t.is_block_step, slot, False)
        be.write(t.draft_tokens, slot, PLACEHOLDER_TOKEN_ID)
        be.write(t.accept_tokens, slot, PLACEHOLDER_TOKEN_ID)
        be.write(t.accept_num, slot, 0)
        be.write(t.max_dec_len, (slot, 0), req.max_tokens)
        # draft side: the prompt shifted left by one; preprocess appends the target's token
        if p > 1:
            be.write(d.input_ids, (slot, slice(0, p - 1)), prompt[1:])
        be.write(d.pre_ids, slot, PLACEHOLDER_TOKEN_ID)
        be.write(d.stop_flags, (slot, 0), False)
        be.write(d.seq_lens_encoder, slot, p)
        be.write(d.seq_lens_decoder, slot, 0)
        be.write(d.seq_lens_this_time, slot, p)
        be.write(d.step_idx, (slot, 0), 0)
        be.write(d.draft_tokens, slot, PLACEHOLDER_TOKEN_ID)
        self.target_cache[slot] = -1
        self.mtp_cache[slot] = -1
        self.requests[slot] = req
        self.outputs[slot] = []

    def _free(self, slot: int) -> None:
        """``TargetRunner.free_slot``: the finished request's target slot stops."""
        be, t = self.be, self.t
        be.write(t.stop_flags, (slot, 0), True)
        be.write(t.seq_lens_this_time, slot, 0)
        be.write(t.seq_lens_encoder, slot, 0)
        be.write(t.seq_lens_decoder, slot, 0)
        self.done.add(slot)

    # ---- one step: the package's op sequences (fastdeploy_mtp.runtime.spec_step) --------------
    def forward_target(self, packed: Packed, slt: np.ndarray, enc: np.ndarray) -> Any:
        """The target model (``TargetStepModel``): ``[T, 2E]`` float32 hidden rows; their next
        tokens are kept for :meth:`target_tokens`."""
        be = self.be
        hidden, self._next_tokens = self._target_forward(
            be.host(packed.ids_remove_padding),
            be.host(packed.cu_seqlens_q),
            slt,
            be.host(self.t.seq_lens_decoder),
        )
        return be.array(hidden)

    def target_tokens(self, hidden: Any, rows: LogitRows) -> tuple[Any, None]:
        """The target's (greedy) tokens at the logit rows; no sampler extras."""
        return self.be.array(self._next_tokens[rows.rows]), None

    def commit_verified(self, accept_num: Any, verified: np.ndarray) -> None:
        """The model keeps no recurrent state: nothing to roll back."""

    def forward_substep(self, substep: int, packed: Packed, token_num: int) -> Any:
        """The MTP layer (``DraftStepModel``) over the staged hidden rows; what
        :meth:`sample_substep` checks its gathered rows against is kept."""
        be, d = self.be, self.d
        self._dslt = be.host(d.seq_lens_this_time).astype(np.int64)
        self._cu = be.host(packed.cu_seqlens_q)
        self._mtp_out = self._mtp_forward(
            be.host(packed.ids_remove_padding),
            be.host(d.target_hidden_states, token_num),
            self._cu,
            self._dslt,
            be.host(d.seq_lens_decoder),
            substep,
        )
        return be.array(self._mtp_out)

    def sample_substep(self, gathered: Any, substep: int) -> Any:
        return self.be.array(
            self._draft_logits(self.be.host(gathered), self._mtp_out, self._cu, self._dslt, substep)
        )

    def empty_substep(self) -> None:
        raise AssertionError("a substep with no token: the loop always has a running slot")

    def _target_forward(
        self, ids: np.ndarray, cu: np.ndarray, slt: np.ndarray, dec: np.ndarray
    ) -> tuple:
        """The target model: ``([T, 2E] float32 hidden rows, [T] int64 next tokens)``; rows no
        item owns (none here) stay zero / -1."""
        m = self.models
        hidden = np.zeros((len(ids), m.hidden_size), np.float32)
        nxt = np.full(len(ids), -1, np.int64)
        for b, first, count in _packed_rows(cu, slt):
            for i in range(count):
                pos, tok = int(dec[b]) + i, int(ids[first + i])
                prev = int(self.target_cache[b, pos - 1]) if pos > 0 else -1
                if pos > 0 and prev < 0:
                    raise AssertionError(
                        f"target: slot {b} position {pos} attends to an unwritten position"
                    )
                self.target_cache[b, pos] = tok
                nxt[first + i] = m.next_token(m.target_table, prev, tok)
                hidden[first + i] = m.row(tok, int(nxt[first + i]))
        return hidden, nxt

    def _mtp_forward(
        self,
        ids: np.ndarray,
        hidden: np.ndarray,
        cu: np.ndarray,
        slt: np.ndarray,
        dec: np.ndarray,
        substep: int,
    ) -> np.ndarray:
        """The MTP layer: ``[token_num, 2E]`` float32 output rows. Each input row's hidden state
        must embed the token before its own (what the layer cached one position earlier);
        rows no item owns must be zero and give zero rows."""
        m = self.models
        out = np.zeros((len(ids), m.hidden_size), np.float32)
        owned = np.zeros(len(ids), bool)
        for b, first, count in _packed_rows(cu, slt):
            for i in range(count):
                r, pos, tok = first + i, int(dec[b]) + i, int(ids[first + i])
                where = f"MTP substep {substep}, slot {b}, position {pos}"
                prev = m.token_of(hidden[r, : m.hidden_size // 2], f"{where}: the hidden row")
                if pos > 0 and prev != self.mtp_cache[b, pos - 1]:
                    raise AssertionError(
                        f"{where}: the hidden row embeds token {prev}, but the token before "
                        f"{tok} is {self.mtp_cache[b, pos - 1]}"
                    )
                self.mtp_cache[b, pos] = tok
                out[r] = m.row(tok, m.next_token(m.draft_table, prev, tok))
                owned[r] = True
        if (hidden[~owned] != 0).any():
            raise AssertionError(
                f"MTP substep {substep}: staged hidden rows no item owns are not zero"
            )
        return out

    def step(self) -> StepRecord:
        """One engine step: the target step, then the proposer's round; finished requests are
        collected and their slots released."""
        be, t, d, n = self.be, self.t, self.d, self.n
        token_num = int(be.host(t.seq_lens_this_time).astype(np.int64).sum())
        if token_num == 0:
            raise RuntimeError("step() with no running slot")
        if d.target_hidden_states is None:  # max_num_batched_tokens + N * W rows, as the proposer's
            d.target_hidden_states = be.array(
                np.zeros((token_num + n * (self.k + 1), self.models.hidden_size), np.float32)
            )
        st = target_step(be, t, self, self.max_len, self.strategy)
        accept_tokens = be.host(t.accept_tokens)
        accept_num = be.host(t.accept_num)
        stop = be.host(t.stop_flags).reshape(-1)
        # ---- proposer round (MTPProposer.run)
        running = st.slt > 0
        prepare_round(be, d, t, st.hidden, self.steps, False)
        propose_substeps(
            be, d, self, int(np.nonzero(running)[0].max()) + 1, token_num, self.steps, self.max_len
        )
        postprocess(be, t)
        # ---- collect (Engine._collect without stop strings)
        decoding = [int(b) for b in np.nonzero(st.decode_mask)[0]]
        record = StepRecord(decoding=decoding, drafts={}, emitted={})
        for slot in map(int, np.nonzero(running)[0]):
            new = [int(x) for x in accept_tokens[slot, : int(accept_num[slot])]]
            record.emitted[slot] = new
            if slot in decoding:
                record.drafts[slot] = [int(x) for x in st.drafts[slot] if x != PLACEHOLDER_TOKEN_ID]
            self.outputs[slot].extend(new)
            if stop[slot]:
                self._free(slot)
        return record

    def _draft_logits(
        self,
        gathered: np.ndarray,
        mtp_out: np.ndarray,
        cu: np.ndarray,
        slt: np.ndarray,
        substep: int,
    ) -> np.ndarray:
        """The greedy draft of every active item: ``[N]`` int64, compacted in batch order (the
        gather op's row ``k`` is the ``k``-th active item's last row). Checks that layout:
        each active item's row equals its last MTP output row, the rest are zero. Entries past
        the active items get a real token id, which ``draft_model_update`` must not read."""
        items = _packed_rows(cu, slt)
        tokens = np.full(self.n, self.models.vocab - 1, np.int64)
        for k, (b, first, count) in enumerate(items):
            if not np.array_equal(gathered[k], mtp_out[first + count - 1]):
                raise AssertionError(
                    f"MTP substep {substep}: gathered row {k} is not slot {b}'s last row"
                )
            tokens[k] = self.models.logits_token(
                gathered[k], f"MTP substep {substep}, gathered row {k}"
            )
        if (gathered[len(items) :] != 0).any():
            raise AssertionError(
                f"MTP substep {substep}: gathered rows past the {len(items)} active items are "
                "not zero"
            )
        return tokens

    # ---- whole runs ---------------------------------------------------------------------------
    def run(self, requests: dict[int, Request], max_steps: int = 1000) -> RunResult:
        """Insert ``requests`` (slot -> request), step until every one finished; outputs in
        slot order. Checks every verified draft chain against the MTP rule on the host."""
        for slot, req in requests.items():
            self.insert(slot, req)
        steps: list[StepRecord] = []
        while len(self.done) < len(requests):
            if len(steps) >= max_steps:
                raise AssertionError(
                    f"not finished after {max_steps} steps: {sorted(set(requests) - self.done)}"
                )
            seqs = {
                b: self.requests[b].prompt + self.outputs[b] for b in requests if b not in self.done
            }
            rec = self.step()
            for b, drafts in rec.drafts.items():
                self._check_chain(b, seqs[b], drafts)
            steps.append(rec)
        return RunResult([self.outputs[b] for b in sorted(requests)], steps)

    def _check_chain(self, slot: int, seq: list[int], drafts: list[int]) -> None:
        """The drafts a decoding slot fed the target: a prefix of the MTP rule's chain from its
        last two tokens, at most ``num_model_steps`` long."""
        m = self.models
        chain = [m.next_token(m.draft_table, seq[-2], seq[-1])]
        while len(chain) < self.steps:
            chain.append(
                m.next_token(m.draft_table, seq[-1] if len(chain) == 1 else chain[-2], chain[-1])
            )
        if len(drafts) > self.steps or drafts != chain[: len(drafts)]:
            raise AssertionError(
                f"slot {slot}: drafts {drafts} are not a prefix of the MTP chain {chain}"
            )
