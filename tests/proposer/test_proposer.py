"""MTPProposer surface: buffers shared with the target by reference, FastDeploy-style
config validation, insertion state, slot reordering, and the substep loop."""

from __future__ import annotations

import numpy as np
import pytest

from fastdeploy_mtp.config import SchedulerConfig, SpeculativeConfig
from fastdeploy_mtp.proposer import CLONED_FROM_TARGET, SHARED_WITH_TARGET, MTPProposer
from fastdeploy_mtp.runtime.input_batch import make_target_inputs
from fastdeploy_mtp.runtime.request import Request, RequestType
from tests.support.engines import make_config


@pytest.fixture()
def proposer(random_model):
    target, mtp = random_model
    cfg = make_config(3, steps=2)
    share = make_target_inputs(cfg)
    p = MTPProposer(cfg, target, 0, 0, share, model=mtp)
    p.initialize_kv_cache(cfg.cache_config.total_block_num)
    return p, share, cfg


def test_shared_buffers_are_the_targets_tensor_objects(proposer):
    p, share, _ = proposer
    assert p.model_inputs.shares_with(share)
    for own, theirs in SHARED_WITH_TARGET.items():
        assert p.model_inputs[own] is share[theirs], own
    # a write through either side is seen by the other
    p.model_inputs.base_model_draft_tokens[0, 1] = 777
    assert int(share.draft_tokens[0, 1]) == 777


def test_cloned_buffers_have_their_own_memory(proposer):
    p, share, _ = proposer
    for name in CLONED_FROM_TARGET:
        mine, theirs = p.model_inputs[name], share[name]
        assert mine is not theirs and mine.data_ptr() != theirs.data_ptr(), name
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, name


def test_caches_mirror_the_target_block_count(proposer):
    p, _, cfg = proposer
    assert len(p.caches) == 2
    assert p.caches[0].shape[0] == cfg.cache_config.total_block_num
    p.update_mtp_block_num(7)
    assert p.caches[0].shape[0] == 7
    p.clear_mtp_cache()
    assert p.caches == []
    with pytest.raises(ValueError, match="main_model_num_blocks"):
        p.initialize_kv_cache(0)


def test_insert_prefill_chunk_shifts_the_prompt_and_sets_lengths(proposer):
    p, _, _ = proposer
    req = Request(
        "a",
        list(range(10, 30)),
        max_tokens=5,
        idx=2,
        prefill_start_index=4,
        prefill_end_index=12,
        task_type=RequestType.PREFILL,
    )
    p.insert_tasks_v1([req])
    x = p.model_inputs
    # chunk [4, 12): the draft sees prompt[5:13] (the next prompt token at the chunk's end)
    np.testing.assert_array_equal(x.input_ids.numpy()[2, :8], np.arange(15, 23))
    assert int(x.seq_lens_encoder[2]) == 8 and int(x.seq_lens_decoder[2]) == 4
    assert int(x.seq_lens_this_time[2]) == 8 and not bool(x.stop_flags[2, 0])
    assert int(x.step_idx[2, 0]) == 0  # not the final chunk
    assert int(x.input_ids_len[2, 0]) == 19
    np.testing.assert_array_equal(x.input_ids_cpu.numpy()[2, :19], np.arange(11, 30))
    assert p.exist_prefill()


def test_abort_stops_the_slot(proposer):
    p, _, _ = proposer
    p.insert_tasks_v1([Request("a", [1, 2, 3], idx=1, prefill_end_index=3)])
    p.insert_tasks_v1([Request("a", [1, 2, 3], idx=1, task_type=RequestType.ABORT)])
    assert bool(p.model_inputs.stop_flags[1, 0]) and int(p.model_inputs.seq_lens_this_time[1]) == 0


def test_reorder_inputs_swaps_every_per_slot_buffer(proposer):
    p, _, _ = proposer
    p.insert_tasks_v1(
        [
            Request("a", [5, 6, 7, 8], idx=0, prefill_end_index=4),
            Request("b", [9, 10], idx=3, prefill_end_index=2),
        ]
    )
    before = {n: p.model_inputs[n].numpy().copy() for n in MTPProposer.SWAPPED}
    p.reorder_inputs([(0, 3)])
    for n in MTPProposer.SWAPPED:
        after = p.model_inputs[n].numpy()
        np.testing.assert_array_equal(after[0], before[n][3], err_msg=n)
        np.testing.assert_array_equal(after[3], before[n][0], err_msg=n)


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_model_steps"):
        SpeculativeConfig(method="mtp", num_speculative_tokens=2, num_model_steps=3)
    with pytest.raises(ValueError, match="mtp_strategy"):
        SpeculativeConfig(mtp_strategy="ngram_only")
    with pytest.raises(ValueError, match="max_num_seqs"):
        SchedulerConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig(method="eagle3")


def test_proposer_requires_mtp_and_a_model(random_model):
    target, mtp = random_model
    cfg = make_config(0)
    with pytest.raises(ValueError, match="method == 'mtp'"):
        MTPProposer(cfg, target, 0, 0, make_target_inputs(cfg), model=mtp)
    cfg = make_config(2)
    with pytest.raises(ValueError, match="model="):
        MTPProposer(cfg, target, 0, 0, make_target_inputs(cfg))


def test_run_writes_one_draft_per_substep_into_the_targets_rows(random_model):
    """After a prefill round, every running item has `num_model_steps` drafts in the target's
    draft row and the target's token count covers [last token, drafts]."""
    from fastdeploy_mtp.assembly import build_engine
    from tests.support.engines import make_requests

    target, mtp = random_model
    engine = build_engine(make_config(3, steps=3), target, mtp)
    reqs = make_requests(3, 2, stagger=0, min_new=20, max_new=21)
    for r in reqs:
        engine.scheduler.add_request(r)
    tasks = engine.scheduler.schedule(0, engine.runner.share_inputs.seq_lens_this_time.numpy())
    engine.runner.insert_tasks(tasks)
    engine.runner.execute()
    share = engine.runner.share_inputs
    drafts = share.draft_tokens.numpy()
    for r in reqs:
        assert (drafts[r.idx, 1:] != -1).all(), drafts[r.idx]
        assert int(share.seq_lens_this_time[r.idx]) == 4
