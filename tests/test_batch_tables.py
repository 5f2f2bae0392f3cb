"""The batch-size tables of ``demo --batch-sizes`` and ``scripts/bench_serve.py
--batch-sizes``, on synthetic numbers: the method mix (from the engine's per-method counts or,
without them, the configured method), median and range over repeats, ratios within a repeat,
and the per-method drafts read from ``/metrics`` deltas."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fastdeploy_mtp.entrypoints.demo_sweep import SweepRow, method_drafts, mix_text, per_step
from fastdeploy_mtp.runtime.engine_metrics import Metrics

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def bench_serve(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # as when run: bench_report beside it
    spec = importlib.util.spec_from_file_location("bench_serve", SCRIPTS / "bench_serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def metrics(method: str, proposed: list[int], accepted: list[int], **counts) -> Metrics:
    m = Metrics.for_drafts(len(proposed), method)
    m.proposed[:] = proposed
    m.accepted[:] = accepted
    for name, value in counts.items():
        setattr(m, name, value)
    return m


def test_method_drafts_reads_the_engines_per_method_counts():
    m = metrics("mtp", [10, 6, 2], [7, 3, 1])
    m.method_drafts = {"mtp": [12, 8], "grammar": [6, 6]}
    assert method_drafts(m) == {"mtp": [12, 8], "grammar": [6, 6]}
    assert method_drafts(Metrics()) == {}


def test_mix_text():
    assert mix_text({"mtp": 30, "ngram": 90, "suffix": 0}) == "ngram 75% mtp 25%"
    assert mix_text({"mtp": 0}) == "-" and mix_text({}) == "-"


def test_sweep_row():
    plain = metrics("none", [], [], generated_tokens=100, wall_seconds=2.0)
    spec = metrics(
        "mtp",
        [40, 20, 10],
        [30, 10, 5],
        generated_tokens=100,
        wall_seconds=0.5,
        decode_item_steps=50,
        emitted_tokens=95,
        method_drafts={"mtp": [70, 45]},
    )
    row = SweepRow(4, plain, spec, identical=True)
    assert row.ratio == 4.0 and row.drafts_per_slot_round == 70 / 50
    assert row.cells() == ["4", "50.0", "200.0", "4.00x", "1.40", "1.90", "mtp 100%", "yes"]
    assert SweepRow(4, Metrics(), spec, identical=False).cells()[3::4] == ["-", "NO"]
    assert per_step(5, 0) == 0.0


def test_median_range(bench_serve):
    assert bench_serve.median_range([3.0, 1.0, 2.0]) == "2 [1, 3]"
    assert bench_serve.median_range([1.0, 2.0], 2, "x") == "1.50x [1.00x, 2.00x]"
    assert bench_serve.median_range([1.234], 1) == "1.2"
    assert bench_serve.median_range([]) == "-"


def round_row(config: str, clients: int, repeat: int, tps: float, **spec) -> dict:
    counts = {"drafts": 0.0, "decode_steps": 0.0, "emitted": 0.0, "methods": {}, **spec}
    return {
        "config": config,
        "clients": clients,
        "repeat": repeat,
        "tokens_per_s": tps,
        "peak_running": clients,
        "spec": counts,
    }


def test_sweep_lines_pair_each_repeat_with_its_plain_round(bench_serve):
    spec = "default speculation"
    rows = [
        round_row("no speculation", 1, 0, 100.0),
        round_row("no speculation", 1, 1, 50.0),
        round_row("no speculation", 1, 2, 80.0),
        round_row("no speculation", 8, 0, 400.0),
        round_row(spec, 1, 2, 120.0, drafts=30, decode_steps=10, emitted=20, methods={"mtp": 30}),
        round_row(
            spec,
            1,
            0,
            300.0,
            drafts=10,
            decode_steps=10,
            emitted=20,
            methods={"mtp": 5, "ngram": 5},
        ),
        round_row(spec, 1, 1, 100.0, drafts=20, decode_steps=20, emitted=40, methods={"ngram": 20}),
        round_row(spec, 8, 0, 200.0, drafts=0, decode_steps=40, emitted=40),
    ]
    one, eight = bench_serve.sweep_lines(rows)
    # ratios per repeat: 300/100, 100/50, 120/80 (not a ratio of medians: 120/80)
    assert one == [
        "1",
        "80 [50, 100]",
        "120 [100, 300]",
        "2.00x [1.50x, 3.00x]",
        "1.50",
        "2.00",
        "mtp 58% ngram 42%",
        "1",
    ]
    assert eight == ["8", "400", "200", "0.50x", "0.00", "1.00", "-", "8"]


def test_spec_deltas_by_method(bench_serve):
    drafts = "fastdeploy:spec_decode_num_draft_tokens_total"
    by_method = bench_serve.BY_METHOD
    before = {drafts: 10.0, drafts + '{method="mtp"}': 10.0}
    after = {drafts: 40.0, drafts + '{method="mtp"}': 40.0}
    counted = bench_serve.spec_deltas(before, after)
    assert counted["drafts"] == 30.0 and counted["methods"] == {}  # no per-method counter
    assert counted["decode_steps"] == 0.0
    before[by_method + '{method="mtp"}'] = 4.0
    after[by_method + '{method="mtp"}'] = 20.0
    after[by_method + '{method="suffix"}'] = 14.0
    assert bench_serve.spec_deltas(before, after)["methods"] == {"mtp": 16.0, "suffix": 14.0}
