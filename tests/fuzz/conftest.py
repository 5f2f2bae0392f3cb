"""Prints what the fuzz suite ran: cases, rejections, successes and any crash, hang or
rejected call that changed an argument (all three must be 0 for the suite to pass)."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter):
    from tests.fuzz.test_fuzz_ops import COMPLETED, STATS

    if STATS["cases"]:
        terminalreporter.write_line(
            "fuzz: {cases} op calls ({rejected} rejected with a clear error, {ok} completed); "
            "crashes {crashes}, hangs {hangs}, rejected calls that changed an argument "
            "{lost_writes}".format(**STATS)
        )
        completed = ", ".join(f"{op} {n}" for op, n in sorted(COMPLETED.items()))
        terminalreporter.write_line(f"fuzz: calls completed (results compared) per op: {completed}")
