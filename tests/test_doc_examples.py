"""Every example in docs/ops.md runs as written, and what it states about its results holds.

Each op section's ``### Example`` is also that op's generated docstring (the op wrappers take
their prose from docs/ops.md), so a stale example would mislead twice. The examples state
their results as ``assert`` lines; a block without one must still run without an error.
The three IPC examples (``set_data_ipc`` -> ``share_external_data`` -> ``unset_data_ipc``)
form one chain and run in one namespace, their shared-memory name replaced by one this test
owns, so they never touch a name a running deployment on this host could be using.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "ops.md"
IPC_OPS = ("set_data_ipc", "share_external_data", "unset_data_ipc")
IPC_NAME = "key_caches_0_rank0.device0"


def examples() -> dict[str, str]:
    """``{op: code}`` for every ``## <op>`` section's python example."""
    found: dict[str, str] = {}
    for section in re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]:
        title = section.split("\n", 1)[0].strip()
        blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)
        assert len(blocks) <= 1, f"docs/ops.md, {title}: more than one python example"
        if blocks:
            found[title] = blocks[0]
    return found


EXAMPLES = examples()
KERNEL_EXAMPLES = sorted(op for op in EXAMPLES if op not in IPC_OPS)


def namespace() -> dict:
    import numpy as np
    import paddle

    import fastdeploy_mtp.ops as ops

    paddle.set_device("cpu")
    ns: dict = {"paddle": paddle, "np": np}
    ns.update({name: getattr(ops, name) for name in dir(ops) if not name.startswith("_")})
    return ns


def test_every_kernel_op_with_a_section_has_an_example():
    from tests.support.op_declarations import DECLARED, HOST_ONLY

    missing = sorted(op for op in DECLARED if op not in HOST_ONLY and op not in EXAMPLES)
    # the ops whose sections carry no example yet are listed here, so a new one is noticed
    assert missing == [
        "draft_model_preprocess",
        "draft_model_update",
        "mtp_step_paddle",
        "speculate_pre_process",
    ]


@pytest.mark.parametrize("op", KERNEL_EXAMPLES)
def test_kernel_op_example_runs_and_its_asserts_hold(op):
    code = EXAMPLES[op]
    assert f"{op}(" in code, f"the {op} example does not call {op}"
    exec(compile(code, f"docs/ops.md ({op} example)", "exec"), namespace())


def test_the_ipc_examples_run_as_one_chain():
    assert all(op in EXAMPLES for op in IPC_OPS)
    name = f"fdmtp_doc_example_{os.getpid()}"
    ns = namespace()
    try:
        for op in IPC_OPS:
            code = EXAMPLES[op]
            assert IPC_NAME in code, f"the {op} example no longer uses {IPC_NAME!r}"
            exec(compile(code.replace(IPC_NAME, name), f"docs/ops.md ({op} example)", "exec"), ns)
        assert not os.path.exists(f"/dev/shm/{name}"), "the unset_data_ipc example removes the name"
    finally:
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")
