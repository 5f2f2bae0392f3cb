"""The offline commands' engine run (``generate``/``demo``) ends a request at the model
folder's EOS ids (here ``generation_config.json``'s), and the shipped byte model, which has
none, runs to ``max_tokens`` as before."""

from __future__ import annotations

import json
import shutil

from fastdeploy_mtp.config import SpeculativeConfig
from fastdeploy_mtp.entrypoints.offline import run_requests
from fastdeploy_mtp.models import ASSETS_DIR

PROMPT = "def add(a, b):"
SPEC = SpeculativeConfig(method="mtp", num_speculative_tokens=2)


def test_generation_config_eos_ends_the_request(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(ASSETS_DIR, folder)
    reqs, texts, _ = run_requests([PROMPT], 12, SPEC, 1, "plain", str(folder))
    assert reqs[0].finish_reason == "length" and len(reqs[0].output_token_ids) == 12
    ids = reqs[0].output_token_ids
    eos = ids[5]
    first = ids.index(eos)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos]}))
    stopped, stopped_texts, _ = run_requests([PROMPT], 12, SPEC, 1, "plain", str(folder))
    assert (
        stopped[0].output_token_ids == ids[: first + 1]
    )  # the EOS id is kept, as the engine keeps EOS
    assert stopped[0].finish_reason == "stop"
    assert texts[0].startswith(stopped_texts[0])
