"""docs/integration.md's minimal loop runs as written, and its output is the reference
engine's: the same token ids and the same number of target forwards for the same prompt."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from fastdeploy_mtp.assembly import build_engine
from fastdeploy_mtp.engine_args import build_config, speculative_config
from fastdeploy_mtp.models import ByteTokenizer, load_tiny
from fastdeploy_mtp.runtime.request import Request

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "integration.md"


def doc_loop() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) == 1, (
        f"docs/integration.md should hold exactly one python block, found {len(blocks)}"
    )
    return blocks[0]


def engine_output(prompt: str, max_tokens: int, k: int) -> tuple[list[int], int]:
    target, mtp, arch = load_tiny()
    req = Request("r0", ByteTokenizer().encode(prompt), max_tokens=max_tokens)
    longest = len(req.prompt_token_ids) + max_tokens + 2 * k + 8
    with build_engine(
        build_config(arch, speculative_config(k), 1, longest), target, mtp if k else None
    ) as engine:
        ids = engine.generate([req])["r0"]
    return ids, engine.metrics.target_forwards


def test_integration_doc_loop_matches_the_engine(tmp_path):
    script = tmp_path / "integration_loop.py"
    script.write_text(doc_loop())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip("\n").split("\n")
    result = json.loads(lines[-1])
    ids = result["token_ids"]
    assert len(ids) == result["max_tokens"]
    # the printed continuation is the decoded ids (the end-id stand-in left out)
    assert all(0 <= t < 256 for t in ids), (
        "every emitted id is a real (byte) token, the last one too"
    )
    text = ByteTokenizer().decode(ids)
    assert "\n".join(lines[:-1]) == result["prompt"] + text

    ref_ids, ref_forwards = engine_output(result["prompt"], result["max_tokens"], result["k"])
    assert ids == ref_ids
    assert result["target_forwards"] == ref_forwards
    # drafts were accepted (fewer forwards than tokens), and greedy speculation changed nothing
    assert ref_forwards < len(ids)
    assert engine_output(result["prompt"], result["max_tokens"], 0)[0] == ref_ids
