"""Qwen3-Next and Qwen3.5 text folders (hybrid Gated DeltaNet / gated attention) against
transformers: target logits for a prompt, the same through chunked prefill of two slots at
once and token-by-token decode on the per-slot linear states, a verify pass whose snapshots
and commit leave the state plain decoding of the accepted tokens leaves, and the MTP layer
against a reference built from transformers' own decoder layer and norms."""

from __future__ import annotations

import json

import numpy as np
import paddle
import pytest

from fastdeploy_mtp.models import inspect_model_folder, load_model
from fastdeploy_mtp.models.hf_config import UnsupportedModelError
from fastdeploy_mtp.models.host_forward_meta import make_forward_meta
from fastdeploy_mtp.models.linear_state import LinearStates, state_specs
from fastdeploy_mtp.models.model_config import has_linear_attention
from tests.support.hf_hybrid_folders import FAMILIES, HybridReference, make_hybrid_folder

BLOCKS_PER_SLOT = 8
SLOTS = 2
MAX_ROWS = 4
PROMPT = [int(t) for t in np.random.default_rng(7).integers(3, 300, 90)]


@pytest.fixture(scope="module", params=FAMILIES)
def loaded(request, tmp_path_factory):
    folder = make_hybrid_folder(tmp_path_factory.mktemp(request.param), request.param)
    target, mtp, config = load_model(folder)
    return folder, HybridReference(folder), target, mtp, config


class Runner:
    """Our target over ``SLOTS`` slots, each with its own blocks and linear state."""

    def __init__(self, target, config):
        self.target, self.config = target, config
        specs = state_specs(config, SLOTS, MAX_ROWS, target.tensor_parallel_size)
        self.states = LinearStates.from_tensors(specs, [paddle.zeros(list(s.shape)) for s in specs])
        shape = target.attn_backend.get_kv_cache_shape(SLOTS * BLOCKS_PER_SLOT)
        self.caches = [paddle.zeros(shape) for _ in range(2 * target.num_cache_layers)]
        self.tables = [
            list(range(s * BLOCKS_PER_SLOT, (s + 1) * BLOCKS_PER_SLOT)) for s in range(SLOTS)
        ]

    def step(self, items: list[tuple[list[int], int, bool]]) -> list[np.ndarray]:
        """One forward; ``items[s] = (tokens, cached_len, prefill)`` for slot ``s``; returns
        each slot's logits ``[n, V]``."""
        ids = [t for tokens, _, _ in items for t in tokens]
        meta = make_forward_meta(
            [len(tokens) for tokens, _, _ in items],
            [cached for _, cached, _ in items],
            self.tables[: len(items)],
            self.caches,
            self.config.block_size,
            ids_remove_padding=ids,
            seq_lens_encoder=[len(t) if prefill else 0 for t, _, prefill in items],
        )
        meta.linear_states = self.states
        with paddle.no_grad():
            logits = self.target.compute_logits(self.target(None, meta)).numpy()
        bounds = np.cumsum([0] + [len(tokens) for tokens, _, _ in items])
        return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_prompt_logits_match_transformers(loaded):
    _, ref, target, _, config = loaded
    want, _ = ref.logits_and_hidden(PROMPT)
    (got,) = Runner(target, config).step([(PROMPT, 0, True)])
    assert _rel(got, want) <= 1e-4


def test_chunked_prefill_and_decode_of_two_slots(loaded):
    """Slot 0 prefills in chunks of 40, 30, 20 (its chunks cross the 64-token chunk of the
    rule) while slot 1 prefills 25 tokens and then decodes; both then decode token by token.
    Every row's logits are transformers' for the whole sequence."""
    _, ref, target, _, config = loaded
    other, extra = PROMPT[::-1][:30], [PROMPT[89 - j] for j in range(3)]
    want0, _ = ref.logits_and_hidden(PROMPT + extra)
    want1, _ = ref.logits_and_hidden(other)
    run = Runner(target, config)
    steps = [
        [(PROMPT[:40], 0, True), (other[:25], 0, True)],
        [(PROMPT[40:70], 40, True), (other[25:26], 25, False)],
        [(PROMPT[70:90], 70, True), (other[26:27], 26, False)],
    ]
    steps += [[([extra[j]], 90 + j, False), ([other[27 + j]], 27 + j, False)] for j in range(3)]
    rows0, rows1 = [], []
    for items in steps:
        got0, got1 = run.step(items)
        rows0.append(got0)
        rows1.append(got1)
    assert _rel(np.concatenate(rows0), want0) <= 1e-4
    assert _rel(np.concatenate(rows1), want1) <= 1e-4


def test_verify_snapshots_and_commit_roll_back_exactly(loaded):
    """A verify pass of 3 rows (the fed token and 2 drafts) then a commit accepting 2 leaves
    the linear states of plain decoding of those 2 tokens; the next token's logits are
    transformers'. Keeping the last row's state (no rollback) gives other logits."""
    _, ref, target, _, config = loaded
    prompt, fed = PROMPT[:50], PROMPT[50:52]
    plain = Runner(target, config)
    plain.step([(prompt, 0, True)])
    plain.step([([fed[0]], 50, False)])
    plain.step([([fed[1]], 51, False)])
    spec = Runner(target, config)
    spec.step([(prompt, 0, True)])
    (rows,) = spec.step([(fed + [299], 50, False)])
    want, _ = ref.logits_and_hidden(prompt + fed + [299])
    assert _rel(rows, want[50:53]) <= 1e-4
    spec.states.commit(paddle.to_tensor([2, 0], dtype="int32"), paddle.to_tensor([True, False]))
    for group in ("conv", "recurrent"):
        for a, b in zip(getattr(plain.states, group), getattr(spec.states, group)):
            np.testing.assert_allclose(b.numpy()[0], a.numpy()[0], atol=1e-5)
    (nxt,) = spec.step([([7], 52, False)])
    want, _ = ref.logits_and_hidden(prompt + fed + [7])
    assert _rel(nxt, want[52:53]) <= 1e-4
    stale = Runner(target, config)
    stale.step([(prompt, 0, True)])
    stale.step([(fed + [299], 50, False)])  # the state after the rejected draft is kept
    (wrong,) = stale.step([([7], 52, False)])
    assert _rel(wrong, want[52:53]) > 1e-3


def test_mtp_logits_match_reference(loaded):
    _, ref, target, mtp, config = loaded
    _, hidden = ref.logits_and_hidden(PROMPT[:40])
    shape = mtp.attn_backend.get_kv_cache_shape(4)
    caches = [paddle.zeros(shape) for _ in range(2)]
    meta = make_forward_meta(
        [39], [0], [[0, 1, 2, 3]], caches, config.block_size, PROMPT[1:40], [39]
    )
    with paddle.no_grad():
        out = mtp(None, paddle.to_tensor(hidden[:39]), meta)
        got = mtp.compute_logits(out).numpy()
    assert _rel(got, ref.mtp_logits(PROMPT[1:40], hidden[:39])) <= 1e-4


def test_state_shapes_and_caches(loaded):
    _, _, target, _, config = loaded
    assert has_linear_attention(config) and target.num_cache_layers == 2
    # conv: 2 * 2 key heads * 16 + 4 value heads * 24 channels, kernel 4
    assert config.hybrid.num_linear_layers == 2
    assert config.hybrid.state_shapes() == ((160, 3), (4, 16, 24))
    assert config.hybrid.state_shapes(2) == ((80, 3), (2, 16, 24))


def test_tensor_parallel_slices_split_heads(loaded):
    """Each TP=2 rank holds its key heads' queries and keys and its value heads' values in
    the convolution (the three parts split on their own), and its heads' A_log."""
    folder, _, target, _, _ = loaded
    full = target.layers[0].linear_attn
    qk = 2 * 16  # the queries' (and the keys') channels: 2 key heads of 16
    for rank in range(2):
        part, _, _ = load_model(folder, tensor_parallel_size=2, tensor_parallel_rank=rank)
        conv = part.layers[0].linear_attn.conv1d.weight.numpy()
        whole = full.conv1d.weight.numpy()
        q, k, vv = (whole[:qk], whole[qk : 2 * qk], whole[2 * qk :])
        half = [x[rank * len(x) // 2 : (rank + 1) * len(x) // 2] for x in (q, k, vv)]
        np.testing.assert_array_equal(conv, np.concatenate(half))
        a_log = part.layers[0].linear_attn.A_log.numpy()
        np.testing.assert_array_equal(a_log, full.A_log.numpy()[rank * 2 : rank * 2 + 2])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_bias": True}, "`attention_bias` true is not supported"),
        ({"layer_types": ["linear_attention", "sliding_attention"] * 2}, "'sliding_attention'"),
        ({"linear_num_value_heads": 3}, "must be a multiple of `linear_num_key_heads`"),
    ],
)
def test_refusals(loaded, tmp_path, change, message):
    folder = loaded[0]
    for f in folder.iterdir():
        (tmp_path / f.name).symlink_to(f)
    config = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(UnsupportedModelError, match=message.replace("(", r"\(")):
        inspect_model_folder(tmp_path)
