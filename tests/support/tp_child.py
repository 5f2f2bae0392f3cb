"""One tensor-parallel rank of the TP tests (run as a script, one process per rank).

    python tp_child.py layers RANK WORLD PORT OUT.json
    python tp_child.py engine RANK WORLD PORT OUT.json MAX_TOKENS

layers: builds each parallel layer full (same seed on every rank) and sharded (this rank's
slice of the full weights), runs both on the same input and records the largest difference
and whether the outputs are bit-identical. engine: loads rank RANK's shard of the shipped
checkpoint and runs the reference engine over the demo prompts in the modes of
:data:`ENGINE_MODES`, recording the token ids and tokens/s. Results go to OUT.json.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

#: (label, K, num_model_steps, hybrid n-gram) of the engine role.
ENGINE_MODES = [("K3S1+ngram", 3, 1, True), ("K2S2", 2, 2, False)]


def run_engine(
    target, mtp, arch, k: int, steps: int, hybrid: bool, max_tokens: int, tp: int, rank: int
):
    """Token ids per demo prompt and tokens/s of one engine run
    (``entrypoints.offline.run_prompts``'s set-up, with the parallel config of rank ``rank`` of
    ``tp``)."""
    import dataclasses

    from fastdeploy_mtp.assembly import build_engine
    from fastdeploy_mtp.config import ParallelConfig
    from fastdeploy_mtp.engine_args import build_config, speculative_config
    from fastdeploy_mtp.models import ByteTokenizer
    from fastdeploy_mtp.runtime.demo_prompts import DEMO_PROMPTS
    from fastdeploy_mtp.runtime.request import Request
    from fastdeploy_mtp.runtime.sampling_params import SamplingParams

    tok = ByteTokenizer()
    reqs = [  # every request max_tokens long: the model's <|endoftext|> masked (ignore_eos)
        Request(
            f"p{i}", tok.encode(p), max_tokens=max_tokens, sampling=SamplingParams(ignore_eos=True)
        )
        for i, p in enumerate(DEMO_PROMPTS)
    ]
    longest = max(len(r.prompt_token_ids) for r in reqs) + max_tokens + 2 * k + 8
    cfg = build_config(arch, speculative_config(k, steps, hybrid), len(reqs), longest)
    cfg = dataclasses.replace(
        cfg,
        parallel_config=ParallelConfig(
            tensor_parallel_size=tp, tensor_parallel_rank=rank, local_rank=rank
        ),
    )
    with build_engine(cfg, target, mtp if k > 0 else None) as engine:
        out = engine.generate(reqs)
    return [out[r.request_id] for r in reqs], engine.metrics.tokens_per_second


def role_engine(rank: int, world: int, port: int, max_tokens: int) -> dict:
    from fastdeploy_mtp.distributed import init_tensor_parallel
    from fastdeploy_mtp.models import load_tiny

    init_tensor_parallel(rank, world, port, timeout=60)
    target, mtp, arch = load_tiny(tensor_parallel_size=world, tensor_parallel_rank=rank)
    result: dict = {"kv_cache_shape": target.attn_backend.get_kv_cache_shape(3)}
    for label, k, steps, hybrid in ENGINE_MODES:
        ids, tps = run_engine(target, mtp, arch, k, steps, hybrid, max_tokens, world, rank)
        result[label] = {"ids": ids, "tokens_per_second": tps}
    return result


def role_layers(rank: int, world: int, port: int) -> dict:
    import numpy as np
    import paddle

    from fastdeploy_mtp.distributed import init_tensor_parallel
    from fastdeploy_mtp.models import (
        ColumnParallelLinear,
        ModelConfig,
        ParallelLMHead,
        ReferenceAttentionBackend,
        RowParallelLinear,
        VocabParallelEmbedding,
        contiguous_block_tables,
        load_state_strict,
        make_forward_meta,
    )
    from fastdeploy_mtp.models.layers import DecoderLayer, PagedStep, RotaryEmbedding
    from fastdeploy_mtp.models.loading import state_to_numpy

    init_tensor_parallel(rank, world, port, timeout=60)
    paddle.set_grad_enabled(False)
    rng = np.random.default_rng(7)  # the same on every rank: full weights and inputs agree
    results: dict = {}

    def compare(name: str, full_layer, shard_layer, *inputs) -> None:
        load_state_strict(shard_layer, state_to_numpy(full_layer), "", world, rank)
        want = full_layer(*inputs).numpy()
        got = shard_layer(*inputs).numpy()
        results[name] = {
            "shape_ok": list(got.shape) == list(want.shape),
            "max_abs_diff": float(np.max(np.abs(got - want))),
            "bit_identical": bool(np.array_equal(got, want)),
            "sha1": hashlib.sha1(got.tobytes()).hexdigest(),
        }

    paddle.seed(11)
    x = paddle.to_tensor(rng.standard_normal([5, 24]).astype(np.float32))
    full_col = paddle.nn.Linear(24, 16, bias_attr=None)
    col = ColumnParallelLinear(24, 16, world, bias_attr=None)
    load_state_strict(col, state_to_numpy(full_col), "", world, rank)
    got = col(x).numpy()
    want = full_col(x).numpy()[:, rank * (16 // world) : (rank + 1) * (16 // world)]
    results["column"] = {
        "shape_ok": list(got.shape) == [5, 16 // world],
        "max_abs_diff": float(np.max(np.abs(got - want))),
        "bit_identical": bool(np.array_equal(got, want)),
        "sha1": hashlib.sha1(got.tobytes()).hexdigest(),
    }

    # Row-parallel: the input is this rank's slice of a full [5, 24] activation.
    full_row = paddle.nn.Linear(24, 12, bias_attr=False)
    row = RowParallelLinear(24, 12, world)
    load_state_strict(row, state_to_numpy(full_row), "", world, rank)
    got = row(x[:, rank * (24 // world) : (rank + 1) * (24 // world)]).numpy()
    want = full_row(x).numpy()
    results["row"] = {
        "shape_ok": list(got.shape) == [5, 12],
        "max_abs_diff": float(np.max(np.abs(got - want))),
        "bit_identical": bool(np.array_equal(got, want)),
        "sha1": hashlib.sha1(got.tobytes()).hexdigest(),
    }

    ids = paddle.to_tensor(np.array([0, 3, 7, 8, 15, 9, 1], np.int64))
    compare(
        "embedding", paddle.nn.Embedding(16, 6), VocabParallelEmbedding(16, 6, world, rank), ids
    )
    h = paddle.to_tensor(rng.standard_normal([4, 10]).astype(np.float32))
    compare("lm_head", paddle.nn.Linear(10, 16, bias_attr=False), ParallelLMHead(10, 16, world), h)

    # A whole decoder layer through the paged backend (GQA, biases on q/k/v).
    cfg = ModelConfig(
        vocab_size=16, ori_vocab_size=16, hidden_size=32, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, block_size=4, attention_bias=True,
    )  # fmt: skip
    full_dec, shard_dec = DecoderLayer(cfg), DecoderLayer(cfg, world)
    load_state_strict(shard_dec, state_to_numpy(full_dec), "", world, rank)
    lens = [5, 3]
    tables, nblocks = contiguous_block_tables(lens, cfg.block_size)
    hx = paddle.to_tensor(rng.standard_normal([sum(lens), cfg.hidden_size]).astype(np.float32))
    rope = RotaryEmbedding(cfg.head_dim, 64, cfg.rope_theta)
    outs = []
    for layer, tp in ((full_dec, 1), (shard_dec, world)):
        backend = ReferenceAttentionBackend(
            cfg.num_attention_heads // tp, cfg.num_key_value_heads // tp, cfg.head_dim, 4
        )
        caches = backend.allocate_caches(1, nblocks)
        meta = make_forward_meta(lens, [0, 0], tables, caches, cfg.block_size)
        cos, sin = rope.lookup(meta.plan().positions)
        outs.append(layer(hx, PagedStep(cos, sin, backend, meta), 0).numpy())
    results["decoder_layer"] = {
        "shape_ok": outs[0].shape == outs[1].shape,
        "max_abs_diff": float(np.max(np.abs(outs[0] - outs[1]))),
        "bit_identical": bool(np.array_equal(outs[0], outs[1])),
        "sha1": hashlib.sha1(outs[1].tobytes()).hexdigest(),
    }
    # Empty inputs (gloo cannot take them): every rank skips the collective alike.
    from fastdeploy_mtp.distributed import broadcast_from_rank0

    results["empty_shapes"] = [
        list(ParallelLMHead(10, 16, world)(paddle.zeros([0, 10])).shape),
        list(RowParallelLinear(24, 12, world)(paddle.zeros([0, 24 // world])).shape),
        list(VocabParallelEmbedding(16, 6, world, rank)(paddle.zeros([0], dtype="int64")).shape),
        list(broadcast_from_rank0(paddle.zeros([0], dtype="int64")).shape),
    ]
    # ... and the group still works afterwards.
    results["after_empty"] = broadcast_from_rank0(
        paddle.to_tensor([rank + 5], dtype="int64")
    ).tolist()
    return results


def main() -> int:
    role, rank, world, port, out = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5],
    )
    if role == "engine":
        result = role_engine(rank, world, port, int(sys.argv[6]))
    elif role == "layers":
        result = role_layers(rank, world, port)
    else:
        raise SystemExit(f"unknown role {role!r}")
    Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
