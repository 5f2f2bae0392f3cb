"""The op declarations (custom_ops/ops/*.toml) and what the build generates from them.

Each op is declared once; the Paddle registration, the pybind function, the entry, the XPU
plugin function and the Python wrapper are generated. These tests pin that the generated
pieces agree with the declarations, that the generator rejects bad declarations with a clear
message, and that a declaration that disagrees with the kernel's Args struct does not compile.
"""

from __future__ import annotations

import importlib.util
import inspect
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import fastdeploy_mtp.ops as ops
from fastdeploy_mtp import _kernels
from tests.support.op_declarations import (
    DECLARATION_DIR,
    DECLARATION_FILES as DECLARATIONS,
    DECLARED,
    HOST_ONLY,
)

ROOT = Path(__file__).resolve().parents[2]


def _codegen():
    spec = importlib.util.spec_from_file_location(
        "op_codegen", ROOT / "custom_ops" / "codegen" / "op_codegen.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["op_codegen"] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


def _declared(path: Path) -> dict:
    return DECLARED[path.stem]


def test_every_kernel_op_is_declared_and_exported():
    names = {p.stem for p in DECLARATIONS}
    manual = set(tomllib.loads((DECLARATION_DIR / "manual_ops.toml").read_text())["ops"])
    assert len(names) == 19
    assert HOST_ONLY == {"speculate_save_output_topk", "speculate_get_output_topk",
                         "mtp_save_first_token", "mtp_get_first_token"}  # fmt: skip
    assert set(ops.OP_NAMES) == names | manual
    for name in names | manual:
        assert callable(getattr(ops, name)), name
        assert callable(getattr(_kernels, name, None)) or name in manual, name


@pytest.mark.parametrize("path", DECLARATIONS, ids=lambda p: p.stem)
def test_python_wrapper_signature_and_inplace_map_follow_the_declaration(path):
    decl = _declared(path)
    trailing = decl.get("trailing_inputs", [])
    inputs = [t["name"] for t in decl["inputs"] if t["name"] not in trailing]
    attrs = [a["name"] for a in decl.get("attrs", [])]
    expected = (attrs + inputs if decl.get("attrs_first") else inputs + attrs) + trailing
    fn = getattr(ops, path.stem)
    assert list(inspect.signature(fn).parameters) == expected
    written = [t["name"] for t in decl["inputs"] if t.get("io", "in") != "in"]
    assert ops.INPLACE_MAPS[path.stem] == {n: f"{n}_out" for n in written}
    # the docstring carries the op's contract from docs/ops.md and one entry per parameter
    doc = inspect.getdoc(fn) or ""
    assert doc.startswith(decl["summary"])
    for name in expected:
        assert f"\n{name} : " in doc, name


@pytest.mark.parametrize("path", DECLARATIONS, ids=lambda p: p.stem)
def test_paddle_registration_follows_the_declaration(path):
    pytest.importorskip("paddle")
    from paddle.utils.cpp_extension import extension_utils

    ops._loader.paddle_op(path.stem)  # loads and registers the library once
    decl = _declared(path)
    registered_inputs, registered_attrs, registered_outputs = extension_utils.parse_op_info(
        path.stem
    )
    # Paddle marks optional inputs (paddle::Optional) with a suffix
    assert registered_inputs == [
        t["name"] + ("@OPTIONAL" if t.get("optional") else "") for t in decl["inputs"]
    ]
    assert registered_attrs == [a["name"] for a in decl.get("attrs", [])]
    default = [o["name"] for o in decl.get("outputs", [])] + [
        f"{t['name']}_out" for t in decl["inputs"] if t.get("io", "in") != "in"
    ]
    assert registered_outputs == decl.get("paddle_outputs", default)


@pytest.mark.parametrize("path", DECLARATIONS, ids=lambda p: p.stem)
def test_kernels_module_takes_outputs_and_stream_as_keywords(path):
    decl = _declared(path)
    first_line = getattr(_kernels, path.stem).__doc__.splitlines()[0]
    keywords = first_line.split("*, ", 1)[1]
    for out in decl.get("outputs", []):
        assert f"{out['name']}: object" in keywords
    assert "stream:" in keywords


def test_no_two_source_files_share_a_basename():
    files = subprocess.run(
        ["git", "ls-files", "custom_ops", "fastdeploy_mtp"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # model folders (fastdeploy_mtp/assets*/) hold data under the names their layout fixes
    # (config.json, tokenizer.json, CARD.md, ...): not source files
    sources = [f for f in files if not f.startswith("fastdeploy_mtp/assets")]
    names = Counter(Path(f).name for f in sources if Path(f).name != "__init__.py")
    assert [n for n, c in names.items() if c > 1] == []


def _write_decl(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "my_op.toml"
    path.write_text(text)
    return path


GOOD = """
summary = "An op."
kernel = "MyOp"
args = "MyOpArgs"
inputs = [{ name = "x", dtype = "int32", shape = "[N]", io = "inout", doc = "" }]
"""


@pytest.mark.parametrize(
    "edit, message",
    [
        (("int32", "int31"), "unknown dtype 'int31'"),
        (('io = "inout"', 'io = "both"'), "io must be one of"),
        (('name = "x"', 'name = "X"'), "not a lower_snake_case name"),
        (('doc = ""', 'doc = "", colour = 1'), "unknown keys ['colour']"),
        (('kernel = "MyOp"\n', ""), "missing key `kernel`"),
    ],
)
def test_generator_rejects_bad_declarations_naming_the_problem(tmp_path, edit, message):
    codegen = _codegen()
    codegen.load_op(_write_decl(tmp_path, GOOD))  # the unedited declaration is fine
    with pytest.raises(codegen.DeclarationError) as info:
        codegen.load_op(_write_decl(tmp_path, GOOD.replace(*edit)))
    assert message in str(info.value) and "my_op.toml" in str(info.value)


def test_generator_rejects_a_default_before_a_required_attr(tmp_path):
    codegen = _codegen()
    text = GOOD + (
        'attrs = [{ name = "a", type = "int", default = 1, doc = "" },\n'
        '         { name = "b", type = "int", doc = "" }]\n'
    )
    with pytest.raises(codegen.DeclarationError, match="`b` has no default but follows"):
        codegen.load_op(_write_decl(tmp_path, text))


def _fake_repo(tmp_path: Path) -> Path:
    """A repository whose declarations can be edited: links to the real sources, copies of
    the declarations."""
    repo = tmp_path / "repo"
    (repo / "custom_ops").mkdir(parents=True)
    for part in ("cpu", "gpu", "xpu", "include", "entry"):
        (repo / "custom_ops" / part).symlink_to(ROOT / "custom_ops" / part)
    shutil.copytree(ROOT / "custom_ops" / "ops", repo / "custom_ops" / "ops")
    (repo / "docs").symlink_to(ROOT / "docs")
    return repo


def test_generator_needs_a_docs_section_and_the_kernel_files(tmp_path):
    codegen = _codegen()
    repo = _fake_repo(tmp_path)
    (repo / "custom_ops" / "ops" / "brand_new_op.toml").write_text(GOOD)
    with pytest.raises(
        codegen.DeclarationError, match=r"no `## <op>` section for \['brand_new_op'\]"
    ):
        codegen.generate(repo, tmp_path / "out")


@pytest.mark.skipif(shutil.which("c++") is None, reason="no host C++ compiler")
def test_a_declaration_that_disagrees_with_the_args_struct_does_not_compile(tmp_path):
    """draft_model_update declared with an int32 `inter_next_tokens` (the Args field is an
    int64 pointer): the generated entry must not compile; the real declaration does."""
    codegen = _codegen()
    repo = _fake_repo(tmp_path)
    decl = repo / "custom_ops" / "ops" / "draft_model_update.toml"

    def compile_entries() -> subprocess.CompletedProcess:
        out = tmp_path / "gen"
        codegen.generate(repo, out)
        return subprocess.run(
            ["c++", "-std=c++17", "-fsyntax-only", "-DFDMTP_XPU_EMULATOR", f"-I{out / 'include'}",
             f"-I{ROOT / 'custom_ops' / 'include'}", f"-I{ROOT / 'custom_ops'}",
             f"-I{ROOT / 'custom_ops' / 'entry'}", str(out / "entries.cc")],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    assert compile_entries().returncode == 0
    text = decl.read_text()
    declared = '{ name = "inter_next_tokens", dtype = "int64"'
    assert declared in text
    decl.write_text(text.replace(declared, declared.replace("int64", "int32")))
    proc = compile_entries()
    assert proc.returncode != 0
    assert "inter_next_tokens" in proc.stderr


HOST_ONLY_GOOD = """
summary = "A host op."
kernel = "MyOp"
host_only = true
inputs = [{ name = "x", dtype = "int32", shape = "[N]", io = "inout", doc = "" }]
"""


@pytest.mark.parametrize(
    "extra, key",
    [('args = "MyOpArgs"\n', "args"), ('cuda_workspace = "Bytes"\n', "cuda_workspace"),
     ('xpu_kernels = ["a", "b"]\n', "xpu_kernels"),
     ('outputs = [{ name = "y", dtype = "int32", alloc = "like:x", shape = "[N]", doc = "" }]\n',
      "outputs"),
     ("prepare_inputs = true\n", "prepare_inputs")],
)  # fmt: skip
def test_generator_rejects_kernel_keys_on_a_host_only_op(tmp_path, extra, key):
    codegen = _codegen()
    assert codegen.load_op(_write_decl(tmp_path, HOST_ONLY_GOOD)).host_only
    with pytest.raises(
        codegen.DeclarationError, match=rf"a host_only op has no kernels; remove \['{key}'\]"
    ):
        codegen.load_op(_write_decl(tmp_path, extra + HOST_ONLY_GOOD))


def test_host_only_ops_have_only_a_host_function_and_no_kernels(tmp_path):
    """A host-only op needs its CPU file only (no per-item header, CUDA or XPU kernel), has no
    XPU plugin function, and its entry requires host tensors and calls host::<Kernel>."""
    codegen = _codegen()
    out = tmp_path / "gen"
    codegen.generate(ROOT, out)
    sources = (out / "op_sources.cmake").read_text()
    entries = (out / "entries.cc").read_text()
    paddle_cc = (out / "paddle_ops.cc").read_text()
    for name in HOST_ONLY:
        kernel = DECLARED[name]["kernel"]
        assert f"custom_ops/cpu/{name}.cc" in sources
        assert f"gpu/{name}.cu" not in sources and f"{name}.xpu" not in sources
        assert f"xpu::{name}" not in (out / "xpu_plugin.cpp").read_text()
        body = entries.split(f"void {kernel}(const {kernel}Call& call) {{", 1)[1].split("\n}\n", 1)[
            0
        ]
        assert "check.OnHost(tensors);" in body and f"host::{kernel}(check, call);" in body
        assert "Dispatch" not in body
        assert f"PD_BUILD_OP({name})" in paddle_cc
        for t in DECLARED[name]["inputs"]:
            assert f"pb::OnHost({t['name']})" in paddle_cc
            if t.get("io", "in") != "in":
                assert f"pb::CopyBack({t['name']}, {t['name']}_host)" in paddle_cc


def test_host_only_op_refuses_device_tensors_in_the_framework_free_module():
    buf = np.zeros(1794, np.int64)
    with pytest.raises(
        ValueError,
        match=r"^mtp_get_first_token: `output_tokens` is on cuda:0; this op runs on the host",
    ):
        _kernels.mtp_get_first_token((buf.ctypes.data, "int64", (1794,), "cuda"), False, 1)


def test_the_paddle_binding_checks_inputs_and_attrs_before_it_allocates_outputs(tmp_path):
    """For every op that allocates outputs, the Paddle kernel function runs the entry's input
    checks (with the op's PrepareInputs) before its first paddle::empty, so a size the
    inputs or attrs make impossible is refused by name, not by the allocator."""
    codegen = _codegen()
    out = tmp_path / "gen"
    codegen.generate(ROOT, out)
    paddle_cc = (out / "paddle_ops.cc").read_text()
    entries = (out / "entries.cc").read_text()
    with_outputs = [decl for decl in DECLARED.values() if decl.get("outputs")]
    assert with_outputs
    for decl in with_outputs:
        kernel = decl["kernel"]
        body = paddle_cc.split(f" {kernel}Kernel(", 1)[1].split("\n}\n", 1)[0]
        assert body.index(f"fdmtp::{kernel}CheckInputs(call);") < body.index("paddle::empty("), (
            kernel
        )
        check_inputs = entries.split(f"void {kernel}CheckInputs(", 1)[1].split("\n}\n", 1)[0]
        assert ("PrepareInputs(check, call);" in check_inputs) == bool(
            decl.get("prepare_inputs")
        ), kernel
