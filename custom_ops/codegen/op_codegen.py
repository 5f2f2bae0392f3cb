"""Generates the op glue from the op declarations in ``custom_ops/ops/*.toml``.

Every op is declared once, as data: its name, its inputs in order (dtype, shape, optional,
in place), its attrs (type, default), the outputs it allocates, and how its arguments map
onto the fields of its per-item ``Args`` struct (``custom_ops/include/fdmtp/<op>.h``).
From those declarations this script writes, into the build folder (never into the
repository):

* ``include/fdmtp/constants.h``  the constants shared by C++ and Python (``constants.toml``)
* ``include/fdmtp/ops.h``        per op: the ``<Op>Call`` struct (TensorRefs, attrs, stream),
                                 the entry ``void <Op>(const <Op>Call&)`` and the hand-written
                                 ``Prepare`` overload the entry calls
* ``include/fdmtp/kernels.h``    the CPU and CUDA kernel declarations
* ``include/fdmtp/xpu_ops.h``    the XPU plugin declarations
* ``entries.cc``                 the op entries: generic checks (device, dtype, contiguity),
                                 ``Prepare`` (shape checks, derived sizes: in the op's CPU
                                 file), the Args pointers and the device dispatch. Assigning
                                 a declared tensor to an Args field of another type (or to a
                                 missing field) does not compile. For an op that allocates
                                 outputs, also ``<Op>CheckInputs``: the entry's checks of the
                                 inputs and attrs alone (with the op's ``PrepareInputs``),
                                 which the Paddle binding runs before it allocates them.
* ``xpu_plugin.cpp``             the XPU plugin functions (limits, CPU fallback, launches)
* ``paddle_ops.cc``              the Paddle custom-op registrations (``PD_BUILD_OP``)
* ``pybind_ops.cc``              the framework-free module's functions (``DefineOps``)
* ``_op_wrappers.py``            the typed Python wrappers (docstrings: the op's section of
                                 ``docs/ops.md`` plus a parameter list from the declaration),
                                 ``OP_NAMES``, ``INPLACE_MAPS`` and the constants
* ``xpu_emu/<op>.cc``            the emulated build's unit per op: ``xpu/kernel/<op>.xpu`` plus
                                 its kernels' emulator entries
* ``op_sources.cmake``           the per-op kernel sources (``cpu/<op>.cc``, ``gpu/<op>.cu``,
                                 ``xpu/kernel/<op>.xpu``) for CMake

Run by CMake at configure time (and again whenever a declaration, ``docs/ops.md`` or this
script changes):  ``python op_codegen.py --repo <root> --out <build>/generated``.
Files whose content did not change are not rewritten, so a no-op regeneration rebuilds
nothing. The schema of a declaration is documented in ``docs/architecture.md``, "Adding an
op".
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# ---- The declaration model ---------------------------------------------------------------

# dtype name -> (C++ element type, TensorRef DType enumerator, Paddle DataType)
DTYPES: dict[str, tuple[str, str, str]] = {
    "bool": ("bool", "kBool", "BOOL"),
    "int8": ("int8_t", "kInt8", "INT8"),
    "uint8": ("uint8_t", "kUInt8", "UINT8"),
    "int32": ("int32_t", "kInt32", "INT32"),
    "int64": ("int64_t", "kInt64", "INT64"),
    "float16": ("void", "kFloat16", "FLOAT16"),
    "bfloat16": ("void", "kBFloat16", "BFLOAT16"),
    "float32": ("float", "kFloat32", "FLOAT32"),
}
# attr type -> (C++ type, Paddle attr type, Python annotation)
ATTR_TYPES: dict[str, tuple[str, str, str]] = {
    "int": ("int", "int", "int"),
    "int64": ("int64_t", "int64_t", "int"),
    "bool": ("bool", "bool", "bool"),
    "float": ("float", "float", "float"),
}
IO_KINDS = ("in", "inout", "out")
NAME_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


class DeclarationError(ValueError):
    pass


@dataclass
class Tensor:
    name: str
    dtype: str  # a DTYPES key, "float" (float32/float16/bfloat16), "same:<input>" or "any"
    shape: str
    doc: str
    io: str = "in"  # in | inout | out (out and inout are Paddle in-place outputs)
    optional: bool = False
    field: str = ""  # Args field ("" = not passed to the kernels)

    @property
    def writes(self) -> bool:
        return self.io != "in"


@dataclass
class Output:  # an output the op allocates (Paddle) or the caller provides (pybind)
    name: str
    dtype: str  # a DTYPES key or "same:<input>"
    alloc: list[str] | str  # C++ dim expressions, or "like:<input>"
    shape: str
    doc: str
    field: str = ""


@dataclass
class Attr:
    name: str
    type: str
    doc: str
    default: object = None
    env: str = ""  # Python wrapper: read this environment variable when the argument is None
    field: str = ""


@dataclass
class Op:
    name: str
    source: Path
    summary: str
    kernel: str  # CamelCase: cpu::<kernel>, cuda::<kernel>, the entry and the Call struct
    args_struct: str
    device_of: str
    inputs: list[Tensor]
    attrs: list[Attr]
    outputs: list[Output]
    template_on: str = ""  # an input whose float dtype instantiates the kernels
    cpu_extra: list[str] = field(default_factory=list)  # attrs passed to the CPU kernel
    cuda_workspace: str = ""  # cuda::<fn>(bsz): bytes of device scratch the launcher needs
    xpu_kernels: list[str] = field(default_factory=list)  # launched in order; "@single": 1x1
    xpu_limits: list[dict[str, str]] = field(default_factory=list)
    attrs_first: bool = False  # Python wrapper: attrs before tensors (FastDeploy's call form)
    # Optional inputs that both bindings take after the attrs (an upstream positional call,
    # all tensors then the attrs, must still work when we add an optional input).
    trailing_inputs: list[str] = field(default_factory=list)
    paddle_outputs: list[str] = field(
        default_factory=list
    )  # Paddle's output order, if not the default
    # A host-only op: one hand-written host function (custom_ops/cpu/<op>.cc) runs on every
    # backend; no Args struct, no per-item header, no CUDA or XPU kernel. The Paddle binding
    # copies device tensors to the host around the call; the entry requires host tensors.
    host_only: bool = False
    # The op's CPU file defines PrepareInputs(check, call): its checks on the inputs and attrs
    # alone (those bounding the sizes of the outputs it allocates, say). The entry runs them
    # after the inputs' generic checks, before the outputs are checked; the Paddle binding
    # runs the same checks before it allocates the outputs.
    prepare_inputs: bool = False

    def output_order(self) -> list[str]:
        """Paddle's outputs: the allocated ones, then `<input>_out` of every written input."""
        default = [o.name for o in self.outputs] + [
            f"{t.name}_out" for t in self.inputs if t.writes
        ]
        return self.paddle_outputs or default

    @property
    def call(self) -> str:
        return self.kernel + "Call"

    def input(self, name: str) -> Tensor:
        for t in self.inputs:
            if t.name == name:
                return t
        raise DeclarationError(f"{self.source}: no input named `{name}`")


def _take(table: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
    """Pops `key` from a TOML table (`default` when absent; required when no default)."""
    if key in table:
        return table.pop(key)
    if default is ...:
        raise DeclarationError(f"{where}: missing key `{key}`")
    return default


def _no_extra(table: dict[str, Any], where: str) -> None:
    if table:
        raise DeclarationError(f"{where}: unknown keys {sorted(table)}")


def _check_name(name: str, where: str) -> str:
    if not NAME_RE.match(name):
        raise DeclarationError(f"{where}: `{name}` is not a lower_snake_case name")
    return name


def _keep(value: Any) -> Any:
    return value


# Per entry list of a declaration: the keys each entry must have and those it may have
# (key -> default), each with its conversion. Every entry also has a `name` and a `field`
# (the Args field, by default the name).
_ENTRY_KEYS: dict[str, tuple[type, dict[str, Any], dict[str, tuple[Any, Any]]]] = {
    "inputs": (
        Tensor,
        {"dtype": str, "shape": str, "doc": str},
        {"io": (str, "in"), "optional": (bool, False)},
    ),
    "attrs": (Attr, {"type": str, "doc": str}, {"default": (_keep, None), "env": (str, "")}),
    "outputs": (Output, {"dtype": str, "alloc": _keep, "shape": str, "doc": str}, {}),
}


def _load_entries(data: dict[str, Any], key: str, where: str) -> list[Any]:
    """The entries of the declaration's list `key` (see _ENTRY_KEYS), checked for unknown keys."""
    cls, required, optional = _ENTRY_KEYS[key]
    absent: Any = (
        ... if key == "inputs" else []
    )  # an op may have no attrs or outputs, never no inputs
    entries = []
    for i, raw in enumerate(_take(data, key, where, absent)):
        w = f"{where}: {key}[{i}]"
        values = {"name": _check_name(str(_take(raw, "name", w)), w)}
        values.update({k: convert(_take(raw, k, w)) for k, convert in required.items()})
        values.update(
            {k: convert(_take(raw, k, w, default)) for k, (convert, default) in optional.items()}
        )
        values["field"] = str(_take(raw, "field", w, values["name"]))
        _no_extra(raw, w)
        entries.append(cls(**values))
    return entries


def load_op(path: Path) -> Op:
    data = tomllib.loads(path.read_text())
    where = str(path)
    name = path.stem
    inputs = _load_entries(data, "inputs", where)
    attrs = _load_entries(data, "attrs", where)
    outputs = _load_entries(data, "outputs", where)
    op = Op(
        name=name,
        source=path,
        summary=str(_take(data, "summary", where)),
        kernel=str(_take(data, "kernel", where)),
        args_struct=str(_take(data, "args", where, "" if data.get("host_only") else ...)),
        device_of=str(_take(data, "device_of", where, inputs[0].name if inputs else "")),
        inputs=inputs,
        attrs=attrs,
        outputs=outputs,
        template_on=str(_take(data, "template_on", where, "")),
        cpu_extra=list(_take(data, "cpu_extra", where, [])),
        cuda_workspace=str(_take(data, "cuda_workspace", where, "")),
        xpu_kernels=list(_take(data, "xpu_kernels", where, [name])),
        xpu_limits=list(_take(data, "xpu_limits", where, [])),
        attrs_first=bool(_take(data, "attrs_first", where, False)),
        trailing_inputs=list(_take(data, "trailing_inputs", where, [])),
        paddle_outputs=list(_take(data, "paddle_outputs", where, [])),
        host_only=bool(_take(data, "host_only", where, False)),
        prepare_inputs=bool(_take(data, "prepare_inputs", where, False)),
    )
    _no_extra(data, where)
    validate(op)
    return op


def validate(op: Op) -> None:
    w = str(op.source)
    names = [t.name for t in op.inputs] + [a.name for a in op.attrs] + [o.name for o in op.outputs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DeclarationError(f"{w}: names used twice: {dup}")
    tensor_names = {t.name for t in op.inputs}
    for t in op.inputs:
        if t.io not in IO_KINDS:
            raise DeclarationError(
                f"{w}: input `{t.name}`: io must be one of {IO_KINDS}, got {t.io!r}"
            )
        _check_dtype(op, t.name, t.dtype, allow_any=True)
        if t.optional and t.writes:
            raise DeclarationError(f"{w}: optional input `{t.name}` cannot be written in place")
    for o in op.outputs:
        _check_dtype(op, o.name, o.dtype, allow_any=False)
        if isinstance(o.alloc, str):
            if not o.alloc.startswith("like:") or o.alloc[5:] not in tensor_names:
                raise DeclarationError(
                    f"{w}: output `{o.name}`: alloc must be a list of dims or 'like:<input>'"
                )
        elif not all(isinstance(d, str) for d in o.alloc):
            raise DeclarationError(
                f"{w}: output `{o.name}`: alloc dims must be strings (C++ expressions)"
            )
    for a in op.attrs:
        if a.type not in ATTR_TYPES:
            raise DeclarationError(
                f"{w}: attr `{a.name}`: type must be one of {sorted(ATTR_TYPES)}"
            )
    for name in op.trailing_inputs:
        if name not in tensor_names or not op.input(name).optional:
            raise DeclarationError(f"{w}: trailing input `{name}` must be an optional input")
    default_outputs = [o.name for o in op.outputs] + [
        f"{t.name}_out" for t in op.inputs if t.writes
    ]
    if op.paddle_outputs and sorted(op.paddle_outputs) != sorted(default_outputs):
        raise DeclarationError(f"{w}: paddle_outputs must order exactly {default_outputs}")
    if op.device_of not in tensor_names:
        raise DeclarationError(f"{w}: device_of `{op.device_of}` is not an input")
    if op.template_on and op.input(op.template_on).dtype != "float":
        raise DeclarationError(
            f"{w}: template_on `{op.template_on}` must be an input of dtype 'float'"
        )
    if op.host_only:
        kernel_keys = {
            "args": op.args_struct, "template_on": op.template_on, "cpu_extra": op.cpu_extra,
            "cuda_workspace": op.cuda_workspace, "xpu_limits": op.xpu_limits,
            "xpu_kernels": op.xpu_kernels != [op.name] and op.xpu_kernels,
            "field": any(t.field != t.name for t in op.inputs)
            or any(a.field != a.name for a in op.attrs),
            "outputs": op.outputs,
            "optional inputs": any(t.optional for t in op.inputs),
            "prepare_inputs": op.prepare_inputs,
        }  # fmt: skip
        used = sorted(k for k, v in kernel_keys.items() if v)
        if used:
            raise DeclarationError(f"{w}: a host_only op has no kernels; remove {used}")
    for extra in op.cpu_extra:
        if extra not in {a.name for a in op.attrs}:
            raise DeclarationError(f"{w}: cpu_extra `{extra}` is not an attr")
    for limit in op.xpu_limits:
        if sorted(limit) != ["limit", "value", "what"]:
            raise DeclarationError(f"{w}: xpu_limits entries need exactly what, value, limit")
    # Defaults must be trailing in the positional list of both bindings.
    seen_default = False
    for p in positional(op, python=False):
        has = isinstance(p, Attr) and p.default is not None
        if seen_default and not has and not (isinstance(p, Tensor) and p.optional):
            raise DeclarationError(
                f"{w}: `{p.name}` has no default but follows a parameter that has one"
            )
        seen_default = seen_default or has


def _check_dtype(op: Op, name: str, dtype: str, allow_any: bool) -> None:
    if dtype in DTYPES or dtype == "float" or (allow_any and dtype == "any"):
        return
    if dtype.startswith("same:") and dtype[5:] in {t.name for t in op.inputs}:
        return
    raise DeclarationError(f"{op.source}: `{name}`: unknown dtype {dtype!r}")


def positional(op: Op, python: bool = True) -> list[Tensor | Attr]:
    """The positional parameters: tensors then attrs, then the `trailing_inputs` (the Python
    wrapper of an `attrs_first` op takes the attrs first, FastDeploy's call form; the pybind
    function never does)."""
    leading = [t for t in op.inputs if t.name not in op.trailing_inputs]
    trailing = [t for t in op.inputs if t.name in op.trailing_inputs]
    if op.attrs_first and python:
        return [*op.attrs, *leading, *trailing]
    return [*leading, *op.attrs, *trailing]


def defaults(op: Op, python: bool = True) -> dict[str, str]:
    """Default per parameter name, for the trailing positional parameters that have one."""
    result: dict[str, str] = {}
    for p in reversed(positional(op, python)):
        if isinstance(p, Attr) and p.default is not None:
            result[p.name] = py_literal(p.default)
        elif isinstance(p, Tensor) and p.optional:
            result[p.name] = "None"
        else:
            break
    return result


def py_literal(value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return repr(value)


def cpp_literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---- Constants ------------------------------------------------------------------------------


@dataclass
class Constant:
    python: str
    cpp: str
    cpp_type: str
    value: int
    doc: str


@dataclass
class Enum:
    python: str
    cpp: str
    count_cpp: str  # the C++ constant holding the number of members
    doc: str
    members: list[tuple[str, str, int, str]]  # (python, cpp, value, doc)


def load_constants(path: Path) -> tuple[list[Constant], list[Enum]]:
    data = tomllib.loads(path.read_text())
    consts = []
    for python, raw in data.get("constants", {}).items():
        w = f"{path}: constants.{python}"
        consts.append(
            Constant(
                python,
                str(_take(raw, "cpp", w)),
                str(_take(raw, "cpp_type", w)),
                int(_take(raw, "value", w)),
                str(_take(raw, "doc", w)),
            )
        )
        _no_extra(raw, w)
    enums = []
    for python, raw in data.get("enums", {}).items():
        w = f"{path}: enums.{python}"
        members = []
        for m in _take(raw, "members", w):
            mw = f"{w}.members"
            members.append(
                (
                    str(_take(m, "name", mw)),
                    str(_take(m, "cpp", mw)),
                    int(_take(m, "value", mw)),
                    str(_take(m, "doc", mw)),
                )
            )
            _no_extra(m, mw)
        enums.append(
            Enum(
                python,
                str(_take(raw, "cpp", w)),
                str(_take(raw, "count_cpp", w)),
                str(_take(raw, "doc", w)),
                members,
            )
        )
        _no_extra(raw, w)
    return consts, enums


# ---- C++ helpers --------------------------------------------------------------------------

HEADER = (
    "// Generated by custom_ops/codegen/op_codegen.py from custom_ops/ops/*.toml. Do not edit.\n"
)


def pointer_type(op: Op, t: Tensor | Output, writes: bool) -> str:
    dtype = t.dtype
    while dtype.startswith("same:"):
        dtype = op.input(dtype[5:]).dtype
    elem = "void" if dtype == "float" else DTYPES[dtype][0]
    return f"{elem}*" if writes else f"const {elem}*"


def dtype_checks(op: Op, t: Tensor | Output, ref: str) -> list[str]:
    if t.dtype == "any":
        return []
    if t.dtype == "float":
        return [f"CheckFloat(check, {ref});"]
    if t.dtype.startswith("same:"):
        return [f"check.Dtype({ref}, call.{t.dtype[5:]}.dtype);"]
    return [f"check.Dtype({ref}, DType::{DTYPES[t.dtype][1]});"]


def kernel_ops(ops: list[Op]) -> list[Op]:
    """The ops with backend kernels (every op but the host-only ones)."""
    return [op for op in ops if not op.host_only]


def template_prefix(op: Op) -> str:
    """The template line of a declaration of an op whose kernels are templates over T."""
    return "template <typename T>\n" if op.template_on else ""


def kernel_call(op: Op, backend: str) -> str:
    targs = "<T>" if op.template_on else ""
    if backend == "cpu":
        extra = "".join(f", call.{a}" for a in op.cpu_extra)
        return f"cpu::{op.kernel}{targs}(args{extra})"
    if backend == "cuda":
        ws = ", workspace" if op.cuda_workspace else ""
        return f"cuda::{op.kernel}{targs}(args{ws}, call.stream)"
    # the XPU3 path launches on the stream of the tensors' device (the binding's call.stream)
    return f"(ctx->stream = call.stream, xpu::{op.name}{targs}(ctx, args))"


def gen_constants_h(consts: list[Constant], enums: list[Enum]) -> str:
    out = [
        HEADER,
        "// Constants shared by the kernels and the Python package "
        "(custom_ops/ops/constants.toml).",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace fdmtp {",
        "",
    ]
    for c in consts:
        out += [f"// {c.doc}", f"constexpr {c.cpp_type} {c.cpp} = {c.value};", ""]
    for e in enums:
        out += [f"// {e.doc}", f"enum {e.cpp} : int {{"]
        out += [f"  {cpp} = {value},  // {doc}" for _, cpp, value, doc in e.members]
        out += ["};", f"constexpr int {e.count_cpp} = {len(e.members)};", ""]
    out += ["}  // namespace fdmtp", ""]
    return "\n".join(out)


def gen_ops_h(ops: list[Op]) -> str:
    out = [
        HEADER,
        """// The op entries, framework-free: each binding (Paddle, pybind) fills an <Op>Call and
// calls <Op>(call). The entry checks every argument (messages name the op and the
// argument) before anything is written, then runs the CPU kernel, the CUDA launcher or the
// XPU plugin for the device of the op's tensors. Throws fdmtp::Error.
#pragma once

#include "fdmtp/entry_api.h"
#include "fdmtp/kernels.h"

namespace fdmtp {
""",
    ]
    for op in ops:
        out.append(f'// {op.name}: {op.summary} Contract: docs/ops.md, "{op.name}".')
        out.append(f"struct {op.call} {{")
        for t in op.inputs:
            kind = "OptionalTensorRef" if t.optional else "TensorRef"
            out.append(f"  {kind} {t.name};  // {t.shape} {t.dtype}, {t.io}")
        for o in op.outputs:
            out.append(f"  TensorRef {o.name};  // {o.shape} {o.dtype}, allocated by the binding")
        for a in op.attrs:
            init = f" = {cpp_literal(a.default)}" if a.default is not None else "{}"
            out.append(f"  {ATTR_TYPES[a.type][0]} {a.name}{init};")
        out.append("  void* stream = nullptr;  // cudaStream_t of CUDA tensors")
        if op.cuda_workspace:
            out.append(
                "  ScratchAllocator* scratch = nullptr;  // device scratch for the CUDA launcher"
            )
        out.append("};")
        out.append(f"void {op.kernel}(const {op.call}& call);")
        if op.host_only:
            out.append(
                f"// The host function of {op.name} (host-only op, its CPU file): its own checks "
                "and"
            )
            out.append(
                "// the work; called by the entry after the generic checks, on host tensors only."
            )
            out.append(
                "namespace host "
                f"{{\nvoid {op.kernel}(const ArgChecker& check, const {op.call}& call);\n}}"
            )
        else:
            out.append(
                f"// Op-specific checks and derived sizes ({op.name}'s CPU file); called by the "
                "entry"
            )
            out.append("// after the generic checks, before anything is written.")
            out.append(
                f"void Prepare(const ArgChecker& check, const {op.call}& call, {op.args_struct}* "
                "args);"
            )
            if op.prepare_inputs:
                out.append(
                    f"// {op.name}'s checks on its inputs and attrs alone (its CPU file); called "
                    "by the"
                )
                out.append(
                    "// entry after the inputs' generic checks, before the outputs are checked."
                )
                out.append(f"void PrepareInputs(const ArgChecker& check, const {op.call}& call);")
            if op.outputs:
                out.append(
                    "// The entry's checks of the inputs and attrs alone, in the entry's order "
                    "(device,"
                )
                out.append(
                    "// storage, dtype and layout of each input, then PrepareInputs where the op "
                    "has one):"
                )
                out.append("// the Paddle binding runs them before it allocates the outputs.")
                out.append(f"void {op.kernel}CheckInputs(const {op.call}& call);")
        out.append("")
    out.append("}  // namespace fdmtp\n")
    return "\n".join(out)


def gen_kernels_h(ops: list[Op]) -> str:
    out = [
        HEADER,
        """\
// The backend kernels, framework-free: argument structs in, no framework types; includers
// need no CUDA headers.
//   fdmtp::cpu::X(args)           runs op X on host memory.
//   fdmtp::cuda::X(args, stream)  launches op X on `stream` (a cudaStream_t, or nullptr for the
//                                 legacy default stream) and returns the cudaError_t as an int
//                                 (0 = success). It never synchronises.
// Templated kernels take T = float, Float16 or BFloat16 (the element type of the float tensors).
#pragma once

#include <cstddef>

#include "fdmtp/cuda_host_api.h"
#include "fdmtp/float_types.h"
""",
    ]
    ops = kernel_ops(ops)
    out += [f'#include "fdmtp/{op.name}.h"' for op in ops]
    out += ["", "namespace fdmtp {", "", "namespace cpu {"]
    for op in ops:
        tmpl = template_prefix(op)
        extra = "".join(
            f", {ATTR_TYPES[next(a for a in op.attrs if a.name == e).type][0]} {e}"
            for e in op.cpu_extra
        )
        out.append(f"{tmpl}void {op.kernel}(const {op.args_struct}& args{extra});")
    out += ["}  // namespace cpu", "", "namespace cuda {"]
    for op in ops:
        tmpl = template_prefix(op)
        ws = ", void* workspace" if op.cuda_workspace else ""
        out.append(f"{tmpl}int {op.kernel}(const {op.args_struct}& args{ws}, Stream stream);")
    out += ["}  // namespace cuda", "", "}  // namespace fdmtp", ""]
    out += [
        "// The same CUDA launchers compiled for the CUDA emulator (gpu/emu/cuda_emu.h), run on "
        "host",
        "// memory: `args` points to the op's fdmtp::<Op>Args, `dtype` is the fdmtp::DType of the",
        "// float tensors of templated ops (ignored by the others). Each returns the cudaError_t;",
        "// cuda_emu_rt::LastMessage() then says what failed. (This namespace is outside `fdmtp`:",
        "// the emulated units rename `fdmtp`, and both sides must agree on these names.)",
        "namespace fdmtp_cuda_emulated {",
    ]
    for op in ops:
        out.append(f"int {op.kernel}(const void* args, int dtype, void* stream);")
    out += ["}  // namespace fdmtp_cuda_emulated", ""]
    return "\n".join(out)


def gen_cuda_emu_adapter(op: Op) -> str:
    """One emulated unit: the op's .cu compiled with the host compiler against the CUDA
    emulator, plus the function the entries call (fdmtp_cuda_emulated::<Kernel>)."""
    a = f"*static_cast<const ::fdmtp::{op.args_struct}*>(args)"
    out = [
        HEADER,
        f"// {op.name}'s CUDA kernels under the emulator. Compiled with -Dfdmtp=fdmtp_cudaemu, so",
        "// `fdmtp` below is this unit's own copy of the package namespace.",
        "#include <vector>",
        "",
        f'#include "gpu/{op.name}.cu"',
        '#include "fdmtp/tensor_ref.h"',
        "",
        "namespace fdmtp_cuda_emulated {",
        "",
        f"int {op.kernel}(const void* args, int dtype, void* stream) {{",
        f"  const ::fdmtp::{op.args_struct}& a = {a};",
    ]
    ws = ""
    if op.cuda_workspace:
        out += [
            "  // Device scratch is not zeroed on a GPU: fill it with a pattern, so a kernel that",
            "  // reads scratch it did not write gives wrong results here too.",
            "  std::vector<unsigned char> workspace(a.bsz > 0 ? "
            f"::fdmtp::cuda::{op.cuda_workspace}(a.bsz) : 0, 0xA5);",
            "  const cuda_emu_rt::RangeScope scratch(workspace.data(), workspace.size());",
        ]
        ws = ", workspace.data()"
    if op.template_on:
        out.append("  switch (static_cast<::fdmtp::DType>(dtype)) {")
        for dt, t in (
            ("kFloat32", "float"),
            ("kFloat16", "::fdmtp::Float16"),
            ("kBFloat16", "::fdmtp::BFloat16"),
        ):
            out.append(
                f"    case ::fdmtp::DType::{dt}: return ::fdmtp::cuda::{op.kernel}<{t}>(a{ws}, "
                "stream);"
            )
        out += ["    default: break;", "  }", "  return cudaErrorInvalidValue;"]
    else:
        out += ["  (void)dtype;", f"  return ::fdmtp::cuda::{op.kernel}(a{ws}, stream);"]
    out += ["}", "", "}  // namespace fdmtp_cuda_emulated", ""]
    return "\n".join(out)


def gen_xpu_ops_h(ops: list[Op]) -> str:
    out = [
        HEADER,
        """\
// The XPU plugin functions, one per op (FastDeploy's Kunlun plugin layering): each checks
// the XPU3 kernel's capacity limits (xpu/xpu_limits.h), then runs on the context's device:
// kCpu runs the CPU kernel, kXpu3 launches the op's XPU3 kernels (xpu/kernel/<op>.xpu).
// Returns 0 on success, else an error code; LastError() then names the op and the cause.
#pragma once

#include "fdmtp/kernels.h"

namespace fdmtp {
namespace xpu {

struct Context;
""",
    ]
    for op in kernel_ops(ops):
        tmpl = template_prefix(op)
        out.append(f"{tmpl}int {op.name}(Context* ctx, const {op.args_struct}& args);")
    out += ["", "}  // namespace xpu", "}  // namespace fdmtp", ""]
    return "\n".join(out)


def entry_tensor_list(op: Op, with_outputs: bool) -> list[str]:
    """C++ lines: `tensors`, the op's tensor arguments (the outputs too if `with_outputs`)."""
    req = [f"&call.{t.name}" for t in op.inputs if not t.optional]
    req += [f"&call.{o.name}" for o in op.outputs] if with_outputs else []
    opt = [f"&call.{t.name}" for t in op.inputs if t.optional]
    lines = ["  std::vector<const TensorRef*> tensors = {" + ", ".join(req) + "};"]
    if opt:
        lines.append(
            "  for (const TensorRef* t : Present({" + ", ".join(opt) + "})) tensors.push_back(t);"
        )
    return lines


def generic_checks(op: Op, checked: list[Tensor] | list[Output]) -> list[str]:
    """C++ lines: the storage, dtype and layout checks of each tensor in `checked`."""
    lines = []
    for c in checked:
        optional = isinstance(c, Tensor) and c.optional
        ref = f"*call.{c.name}" if optional else f"call.{c.name}"
        checks = [f"check.Storage({ref});", *dtype_checks(op, c, ref)]
        if c.dtype != "any":
            checks.append(f"check.Contiguous({ref});")
        lines += [f"  if (call.{c.name}) {line}" if optional else f"  {line}" for line in checks]
    return lines


def gen_entries_cc(ops: list[Op]) -> str:
    out = [
        HEADER,
        '#include "dispatch.h"',
        '#include "fdmtp/dtype_dispatch.h"',
        '#include "fdmtp/ops.h"',
        "",
        "namespace fdmtp {",
        "",
    ]
    for op in ops:
        input_checks = generic_checks(op, op.inputs)
        if op.prepare_inputs:
            input_checks.append("  PrepareInputs(check, call);")
        if op.outputs and not op.host_only:
            out.append(f"void {op.kernel}CheckInputs(const {op.call}& call) {{")
            out.append(f'  const ArgChecker check("{op.name}");')
            out += entry_tensor_list(op, with_outputs=False)
            out.append("  check.SameDevice(tensors);")
            out += input_checks
            out.append("}")
            out.append("")
        out.append(f"void {op.kernel}(const {op.call}& call) {{")
        out.append(f'  const ArgChecker check("{op.name}");')
        out += entry_tensor_list(op, with_outputs=True)
        out.append("  check.OnHost(tensors);" if op.host_only else "  check.SameDevice(tensors);")
        out += input_checks
        out += generic_checks(op, op.outputs)
        if op.host_only:
            out.append(f"  host::{op.kernel}(check, call);")
            out.append("}")
            out.append("")
            continue
        out.append(f"  {op.args_struct} args{{}};")
        for t in op.inputs:
            if not t.field:
                continue
            ptype = pointer_type(op, t, t.writes)
            if t.optional:
                out.append(f"  args.{t.field} = DataOrNull<{ptype[:-1]}>(call.{t.name});")
            else:
                out.append(f"  args.{t.field} = call.{t.name}.ptr<{ptype[:-1]}>();")
        for o in op.outputs:
            if o.field:
                out.append(
                    f"  args.{o.field} = call.{o.name}.ptr<{pointer_type(op, o, True)[:-1]}>();"
                )
        for a in op.attrs:
            if a.field:
                out.append(f"  args.{a.field} = call.{a.name};")
        out.append("  Prepare(check, call, &args);")
        device = f"call.{op.device_of}.device"
        cpu, cuda, xpu = (kernel_call(op, b) for b in ("cpu", "cuda", "xpu"))
        if op.cuda_workspace:
            cuda_fn = (
                f"[&]() -> int {{ void* workspace = CudaWorkspace(check, call.scratch, "
                f"CudaWorkspaceBytes{op.kernel}(args)); return workspace == nullptr ? 0 : {cuda}; "
                f"}}"
            )
        else:
            cuda_fn = f"[&] {{ return {cuda}; }}"
        dtype = f"static_cast<int>(call.{op.template_on}.dtype)" if op.template_on else "0"
        emu_fn = f"[&] {{ return fdmtp_cuda_emulated::{op.kernel}(&args, {dtype}, call.stream); }}"
        body = (
            f"Dispatch(check, {device}, [&] {{ {cpu}; }}, {cuda_fn}, [&](xpu::Context* ctx) "
            f"{{ return {xpu}; }}, tensors, {emu_fn});"
        )
        if op.template_on:
            out.append(f"  DispatchFloat(check, call.{op.template_on}, [&](auto tag) {{")
            out.append("    using T = typename decltype(tag)::type;")
            out.append(f"    {body}")
            out.append("  });")
        else:
            out.append(f"  {body}")
        out.append("}")
        out.append("")
    out.append("}  // namespace fdmtp\n")
    text = "\n".join(out)
    # The CUDA scratch size of ops with a workspace: cuda::<fn>(bsz), or 0 without CUDA.
    helpers = []
    for op in ops:
        if op.cuda_workspace:
            helpers.append(
                f"inline size_t CudaWorkspaceBytes{op.kernel}(const {op.args_struct}& args) {{\n"
                "#if defined(FDMTP_WITH_CUDA)\n  return args.bsz == 0 ? 0 : "
                f"cuda::{op.cuda_workspace}(args.bsz);\n#else\n  (void)args;\n  return "
                f"0;\n#endif\n}}\n"
            )
    return text.replace("namespace fdmtp {\n", "namespace fdmtp {\n\n" + "\n".join(helpers), 1)


def gen_xpu_plugin_cpp(ops: list[Op]) -> str:
    ops = kernel_ops(ops)
    out = [HEADER, '#include "wrapper.h"', ""]
    for op in ops:
        extra = ", int64_t elem_bytes" if op.template_on else ""
        for k in op.xpu_kernels:
            out.append(f"FDMTP_XPU_KERNEL({k.split('@')[0]}, fdmtp::{op.args_struct} args{extra});")
    out += ["", "namespace fdmtp {", "namespace xpu {", ""]
    for op in ops:
        tmpl = template_prefix(op)
        extra = ", static_cast<int64_t>(sizeof(T))" if op.template_on else ""
        out.append(f"{tmpl}int {op.name}(Context* ctx, const {op.args_struct}& args) {{")
        out.append(f'  constexpr const char* kOp = "{op.name}";')
        for lim in op.xpu_limits:
            out.append(
                f'  FDMTP_XPU_CHECK(detail::CheckLe(kOp, "{lim["what"]}", args.{lim["value"]}, '
                f'"{lim["limit"]}", {lim["limit"]}));'
            )
        launches = []
        for k in op.xpu_kernels:
            kernel, _, where = k.partition("@")
            target = "&single" if where == "single" else "ctx"
            launches.append(f"FDMTP_XPU_LAUNCH(kOp, {target}, {kernel}, args{extra});")
        needs_single = any(k.endswith("@single") for k in op.xpu_kernels)
        targs = "<T>" if op.template_on else ""
        extra_cpu = ", 0" * len(op.cpu_extra)  # the plugin's CPU fallback: automatic CPU threads
        out.append("  return detail::Run(")
        out.append(f"      ctx, kOp, [&] {{ cpu::{op.kernel}{targs}(args{extra_cpu}); }},")
        out.append("      [&]() -> int {")
        if needs_single:
            out.append("        Context single = detail::SingleCore(*ctx);")
        for line in launches:
            out.append(f"        {line}")
        out.append("        return kSuccess;")
        out.append("      });")
        out.append("}")
        if op.template_on:
            out.append(
                f"#define FDMTP_INSTANTIATE(T) template int {op.name}<T>(Context*, const "
                f"{op.args_struct}&);"
            )
            out.append("FDMTP_FOR_EACH_FLOAT_TYPE(FDMTP_INSTANTIATE)")
            out.append("#undef FDMTP_INSTANTIATE")
        out.append("")
    out += ["}  // namespace xpu", "}  // namespace fdmtp", ""]
    return "\n".join(out)


def paddle_dtype(op: Op, dtype: str, var: str) -> str:
    """The Paddle DataType of an output, where `var(name)` spells an input's dtype."""
    if dtype.startswith("same:"):
        return var.format(dtype[5:])
    return f"paddle::DataType::{DTYPES[dtype][2]}"


def alloc_dims(o: Output, shape_of: str) -> str:
    if isinstance(o.alloc, str):
        return shape_of.format(o.alloc[5:])
    return "{" + ", ".join(o.alloc) + "}"


def gen_paddle_cc(ops: list[Op]) -> str:
    out = [
        HEADER,
        '#include "paddle_tensor.h"',
        "",
        "namespace {",
        "",
        "namespace pb = fdmtp::paddle_binding;",
        "using pb::Dim;",
        "",
    ]
    for op in ops:
        params = []
        for t in op.inputs:
            kind = (
                "const paddle::optional<paddle::Tensor>&" if t.optional else "const paddle::Tensor&"
            )
            params.append(f"{kind} {t.name}")
        params += [f"{ATTR_TYPES[a.type][0]} {a.name}" for a in op.attrs]
        ret = "std::vector<paddle::Tensor>" if op.outputs else "void"
        out.append(f"{ret} {op.kernel}Kernel({', '.join(params)}) {{")
        if op.outputs:
            out.append("  std::vector<paddle::Tensor> outs;")
        out.append(f'  pb::RunEntry("{op.name}", [&] {{')
        out.append(f"    fdmtp::{op.call} call;")
        if op.host_only:  # device tensors: run on host copies, written ones copied back
            for t in op.inputs:
                out.append(f"    paddle::Tensor {t.name}_host = pb::OnHost({t.name});")
                out.append(f'    call.{t.name} = pb::ToRef({t.name}_host, "{t.name}");')
            for a in op.attrs:
                out.append(f"    call.{a.name} = {a.name};")
            out.append(f"    fdmtp::{op.kernel}(call);")
            for t in op.inputs:
                if t.writes:
                    out.append(f"    pb::CopyBack({t.name}, {t.name}_host);")
            out.append("  });")
            out.append("}")
            out.append("")
            continue
        for t in op.inputs:
            conv = "ToOptionalRef" if t.optional else "ToRef"
            out.append(f'    call.{t.name} = pb::{conv}({t.name}, "{t.name}");')
        for a in op.attrs:
            out.append(f"    call.{a.name} = {a.name};")
        if op.outputs:  # nothing is allocated before the inputs and attrs passed their checks
            out.append(f"    fdmtp::{op.kernel}CheckInputs(call);")
        place = f"{op.device_of}.place()"
        for o in op.outputs:
            dims = alloc_dims(o, "{}.shape()")
            dt = paddle_dtype(op, o.dtype, "{}.dtype()")
            out.append(
                f"    paddle::Tensor {o.name} = paddle::empty(pb::Allocatable({dims}), {dt}, "
                f"{place});"
            )
            out.append(f'    call.{o.name} = pb::ToRef({o.name}, "{o.name}");')
        out.append(f"    call.stream = pb::StreamOf({op.device_of});")
        if op.cuda_workspace:
            out.append(f"    pb::PaddleScratch scratch({place});")
            out.append("    call.scratch = &scratch;")
        out.append(f"    fdmtp::{op.kernel}(call);")
        if op.outputs:
            out.append("    outs = {" + ", ".join(o.name for o in op.outputs) + "};")
        out.append("  });")
        if op.outputs:
            out.append("  return outs;")
        out.append("}")
        out.append("")
        if op.outputs:
            inplace = [t for t in op.inputs if t.writes]
            sp = [
                f"const std::vector<int64_t>& {t.name}"
                if not t.optional
                else f"const paddle::optional<std::vector<int64_t>>& {t.name}"
                for t in op.inputs
            ]
            sp += [f"{ATTR_TYPES[a.type][0]} {a.name}" for a in op.attrs]
            out.append(f"std::vector<std::vector<int64_t>> {op.kernel}Shape({', '.join(sp)}) {{")
            for name in [t.name for t in op.inputs] + [a.name for a in op.attrs]:
                out.append(f"  (void){name};")
            shape_of = {o.name: alloc_dims(o, "{}") for o in op.outputs}
            shape_of.update({f"{t.name}_out": t.name for t in inplace})
            shapes = [shape_of[n] for n in op.output_order()]
            out.append("  return {" + ", ".join(f"pb::Inferred({s})" for s in shapes) + "};")
            out.append("}")
            out.append("")
            dp = [
                f"const paddle::DataType& {t.name}"
                if not t.optional
                else f"const paddle::optional<paddle::DataType>& {t.name}"
                for t in op.inputs
            ]
            out.append(f"std::vector<paddle::DataType> {op.kernel}Dtype({', '.join(dp)}) {{")
            for t in op.inputs:
                out.append(f"  (void){t.name};")
            dtype_of = {o.name: paddle_dtype(op, o.dtype, "{}") for o in op.outputs}
            dtype_of.update({f"{t.name}_out": t.name for t in inplace})
            dts = [dtype_of[n] for n in op.output_order()]
            out.append("  return {" + ", ".join(dts) + "};")
            out.append("}")
            out.append("")
    out.append("}  // namespace")
    out.append("")
    for op in ops:
        ins = [f'paddle::Optional("{t.name}")' if t.optional else f'"{t.name}"' for t in op.inputs]
        outs = [f'"{n}"' for n in op.output_order()]
        out.append(f"PD_BUILD_OP({op.name})")
        out.append("    .Inputs({" + ", ".join(ins) + "})")
        out.append("    .Outputs({" + ", ".join(outs) + "})")
        if op.attrs:
            out.append(
                "    .Attrs({"
                + ", ".join(f'"{a.name}: {ATTR_TYPES[a.type][1]}"' for a in op.attrs)
                + "})"
            )
        pairs = [f'{{"{t.name}", "{t.name}_out"}}' for t in op.inputs if t.writes]
        if pairs:
            out.append("    .SetInplaceMap({" + ", ".join(pairs) + "})")
        if op.outputs:
            out.append(f"    .SetInferShapeFn(PD_INFER_SHAPE({op.kernel}Shape))")
            out.append(f"    .SetInferDtypeFn(PD_INFER_DTYPE({op.kernel}Dtype))")
        out.append(f"    .SetKernelFn(PD_KERNEL({op.kernel}Kernel));")
        out.append("")
    return "\n".join(out)


def gen_pybind_cc(ops: list[Op]) -> str:
    out = [
        HEADER,
        "#include <pybind11/pybind11.h>",
        "",
        '#include "fdmtp/ops.h"',
        '#include "generated_ops.h"',
        '#include "scratch.h"',
        '#include "tensor_arg.h"',
        "",
        "namespace py = pybind11;",
        "",
        "namespace {",
        "",
    ]
    for op in ops:
        params = []
        for p in positional(op, python=False):
            # attrs arrive as Python objects and are range-checked here, so an out-of-range
            # value is an error naming the op and the attr (not pybind's TypeError)
            params.append(f"py::object {p.name}")
        params += [f"py::handle {o.name}" for o in op.outputs]
        params.append("uintptr_t stream")
        out.append(f"void {op.kernel}Py({', '.join(params)}) {{")
        out.append(f'  fdmtp::pybind::ArgScope scope("{op.name}");')
        out.append(f"  fdmtp::{op.call} call;")
        for t in op.inputs:
            conv = "ConvertOptional" if t.optional else "Convert"
            out.append(f'  call.{t.name} = scope.{conv}({t.name}, "{t.name}");')
        for o in op.outputs:
            out.append(f'  call.{o.name} = scope.Convert({o.name}, "{o.name}");')
        for a in op.attrs:
            out.append(f"  call.{a.name} = {pybind_attr(a)};")
        out.append("  call.stream = reinterpret_cast<void*>(stream);")
        if op.cuda_workspace:
            out.append("  fdmtp::pybind::StreamScratch scratch(call.stream);")
            out.append("  call.scratch = &scratch;")
        out.append(f"  fdmtp::{op.kernel}(call);")
        out.append("}")
        out.append("")
    out += [
        "}  // namespace",
        "",
        "namespace fdmtp {",
        "namespace pybind {",
        "",
        "void DefineOps(py::module_& m) {",
    ]
    for op in ops:
        dflt = defaults(op, python=False)
        args: list[str] = []
        for p in positional(op, python=False):
            arg = f'py::arg("{p.name}")'
            if isinstance(p, Tensor) and p.optional:
                arg += ".none(true)"
            if p.name in dflt:
                value = dflt[p.name]
                if value == "None":
                    arg += " = py::none()"
                elif value in ("True", "False"):
                    arg += f" = py::bool_({cpp_literal(_unrepr(value))})"
                else:
                    arg += f" = py::int_({value})"
            args.append(arg)
        args.append("py::kw_only()")
        args += [f'py::arg("{o.name}")' for o in op.outputs]
        args.append('py::arg("stream") = 0')
        doc = f"See fastdeploy_mtp.ops.{op.name}. Tensors: DLPack objects or raw-pointer tuples."
        if op.outputs:
            doc += (
                " Caller-allocated outputs (keyword): "
                + ", ".join(f"`{o.name}` {o.shape} {o.dtype}" for o in op.outputs)
                + "."
            )
        out.append(f'  m.def("{op.name}", &{op.kernel}Py, {", ".join(args)},')
        out.append(f"        {cpp_string(doc)});")
    out += ["}", "", "}  // namespace pybind", "}  // namespace fdmtp", ""]
    return "\n".join(out)


def pybind_attr(a: Attr) -> str:
    """The C++ expression converting attr `a` from its Python object (range-checked)."""
    if a.type == "bool":
        return f'scope.BoolAttr({a.name}, "{a.name}")'
    if a.type == "int":
        return f'static_cast<int>(scope.IntAttr({a.name}, "{a.name}", 32))'
    if a.type == "int64":
        return f'scope.IntAttr({a.name}, "{a.name}", 64)'
    raise DeclarationError(f"attr `{a.name}`: no pybind conversion for type {a.type!r}")


def _unrepr(value: str) -> object:
    if value in ("True", "False"):
        return value == "True"
    return value


def cpp_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gen_pybind_h() -> str:
    return (
        HEADER
        + """#pragma once

#include <pybind11/pybind11.h>

namespace fdmtp {
namespace pybind {

// Registers every declared op on the framework-free module.
void DefineOps(pybind11::module_& m);

}  // namespace pybind
}  // namespace fdmtp
"""
    )


# ---- Python --------------------------------------------------------------------------------


def doc_sections(ops_md: str) -> dict[str, str]:
    """`## <name>` sections of docs/ops.md, by name (the text up to the next `## `)."""
    sections: dict[str, str] = {}
    current = None
    lines: list[str] = []
    for line in ops_md.splitlines():
        if line.startswith("## "):
            if current is not None:
                sections[current] = "\n".join(lines).strip()
            current = line[3:].strip().strip("`")
            lines = []
        elif current is not None:
            lines.append(line)
    if current is not None:
        sections[current] = "\n".join(lines).strip()
    return sections


def tensor_kind(op: Op, t: Tensor | Output) -> str:
    dtype = t.dtype
    if dtype.startswith("same:"):
        dtype = f"the dtype of ``{dtype[5:]}``"
    elif dtype == "float":
        dtype = "float32, float16 or bfloat16"
    elif dtype == "any":
        dtype = "any dtype"
    return dtype


def py_docstring(op: Op, prose: str) -> str:
    lines = [op.summary, ""]
    if prose:
        lines += [prose, ""]
    lines += ["Parameters", "----------"]
    for p in positional(op):
        if isinstance(p, Tensor):
            role = {"in": "in", "inout": "**in/out** (in place)", "out": "**out** (in place)"}[p.io]
            typ = "paddle.Tensor | None" if p.optional else "paddle.Tensor"
            lines.append(f"{p.name} : {typ}")
            lines.append(f"    Shape ``{p.shape}``, {tensor_kind(op, p)}, {role}. {p.doc}".rstrip())
        else:
            typ = ATTR_TYPES[p.type][2]
            if p.env:
                lines.append(f"{p.name} : {typ} | None")
                lines.append(
                    f"    {p.doc} ``None``: the environment variable ``{p.env}`` if set, else "
                    f"{py_literal(p.default)}."
                )
            else:
                lines.append(f"{p.name} : {typ}")
                lines.append(f"    {p.doc}")
    if op.outputs:
        lines += ["", "Returns", "-------"]
        for o in op.outputs:
            lines.append(f"{o.name} : paddle.Tensor")
            lines.append(f"    Shape ``{o.shape}``, {tensor_kind(op, o)}. {o.doc}".rstrip())
    lines += [
        "",
        "Raises",
        "------",
        "OpError",
        "    An argument is rejected (see Errors above); the message names the op and the "
        "argument,",
        "    and nothing has been written.",
    ]
    return "\n".join(lines)


def without_subsections(prose: str, titles: tuple[str, ...]) -> str:
    """`prose` without its `### <title>` subsections named in `titles` (e.g. the test list)."""
    kept: list[str] = []
    skipping = False
    for line in prose.splitlines():
        if line.startswith("### "):
            skipping = line[4:].strip() in titles
        if not skipping:
            kept.append(line)
    return "\n".join(kept).strip()


def py_docstring_source(text: str) -> str:
    """A docstring literal for a function body: indented by 4, quotes escaped."""
    body = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = ['"""' + body.splitlines()[0]] + [
        ("    " + line).rstrip() for line in body.splitlines()[1:]
    ]
    return "    " + "\n".join(lines) + '\n    """'


def gen_python(
    ops: list[Op],
    manual: list[str],
    consts: list[Constant],
    enums: list[Enum],
    sections: dict[str, str],
) -> str:
    out = [
        '"""Typed Python wrappers of the native ops, generated from custom_ops/ops/*.toml by',
        "custom_ops/codegen/op_codegen.py at build time. Do not edit: change the declaration (or "
        "the",
        'op\'s section of docs/ops.md, which is each docstring\'s prose) and rebuild."""',
        "",
        "from __future__ import annotations",
        "",
        "import enum",
        "import os",
        "from typing import TYPE_CHECKING, Final",
        "",
        "from ._loader import bool_attr, int_attr, run_paddle_op, tensor_arg",
        "",
        "if TYPE_CHECKING:",
        "    import paddle",
        "",
    ]
    for c in consts:
        out.append(f"#: {c.doc}")
        out.append(f"{c.python}: Final = {c.value}")
        out.append("")
    for e in enums:
        out += ["", f"class {e.python}(enum.IntEnum):", f'    """{e.doc}"""', ""]
        for name, _, value, doc in e.members:
            out.append(f"    {name} = {value}  #: {doc}")
        names = ", ".join(repr(name.lower()) for name, _, _, _ in e.members)
        out += [
            "",
            "    @classmethod",
            f"    def from_string(cls, name: str) -> {e.python}:",
            f'        """The member named ``name``, in any case ({names}, as FastDeploy\'s',
            '        configuration spells them); ``ValueError`` naming the choices otherwise."""',
            "        member = cls.__members__.get(name.strip().upper()) if isinstance(name, str) "
            "else None",
            "        if member is None:",
            f'            raise ValueError(f"unknown {e.python} {{name!r}}; '
            f'expected one of {names}")',
            "        return member",
            "",
        ]
    all_names = sorted([op.name for op in ops] + manual)
    out += [
        "",
        "#: Every op the Paddle library registers (the kernel ops and the IPC ops).",
        "OP_NAMES: Final[tuple[str, ...]] = ("
        + "".join(f'\n    "{n}",' for n in all_names)
        + "\n)",
        "",
    ]
    out.append(
        "#: The docstrings of the hand-written IPC op wrappers (their sections of docs/ops.md)."
    )
    out.append("MANUAL_OP_DOCS: Final[dict[str, str]] = {")
    for name in manual:
        out.append(f"    {name!r}: {sections.get(name, '')!r},")
    out += ["}", ""]
    out.append(
        "#: Each kernel op's tensor inputs (Paddle's input order) and attrs, for calls by keyword."
    )
    out.append("OP_SIGNATURES: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {")
    for op in ops:
        ins = "".join(f'"{t.name}", ' for t in op.inputs)
        ats = "".join(f'"{a.name}", ' for a in op.attrs)
        out.append(f'    "{op.name}": (({ins}), ({ats})),')
    out += ["}", ""]
    out.append("#: Each kernel op's in-place map: input name -> Paddle output name.")
    out.append("INPLACE_MAPS: Final[dict[str, dict[str, str]]] = {")
    for op in ops:
        pairs = ", ".join(f'"{t.name}": "{t.name}_out"' for t in op.inputs if t.writes)
        out.append(f'    "{op.name}": {{{pairs}}},')
    out += [
        "}",
        "",
        "",
        "def _from_env(value: int | None, env: str, default: int) -> object:",
        '    """`value` (range-checked by the caller), else the integer in environment '
        "variable `env`",
        '    if set, else `default`."""',
        "    if value is not None:",
        "        return value",
        "    text = os.environ.get(env)",
        '    if text is None or text.strip() == "":',
        "        return default",
        "    try:",
        "        return int(text)",
        "    except ValueError:",
        '        raise ValueError(f"{env}={text!r} is not an integer") from None',
        "",
    ]
    for op in ops:
        dflt = defaults(op)
        params = []
        for p in positional(op):
            if isinstance(p, Tensor):
                typ = "paddle.Tensor | None" if p.optional else "paddle.Tensor"
            else:
                typ = ATTR_TYPES[p.type][2] + (" | None" if p.env else "")
            d = dflt.get(p.name)
            if isinstance(p, Attr) and p.env:
                d = "None"
            params.append(f"    {p.name}: {typ}" + (f" = {d}" if d is not None else "") + ",")
        if len(op.outputs) == 0:
            ret = "None"
        elif len(op.outputs) == 1:
            ret = "paddle.Tensor"
        else:
            ret = "tuple[" + ", ".join(["paddle.Tensor"] * len(op.outputs)) + "]"
        out += ["", "", f"def {op.name}(", *params, f") -> {ret}:"]
        prose = without_subsections(sections.get(op.name, ""), ("Tests",))
        out.append(py_docstring_source(py_docstring(op, prose)))
        call_args = []
        for t in op.inputs:
            flags = (", writes=True" if t.writes else "") + (
                ", optional=True" if t.optional else ""
            )
            call_args.append(f'tensor_arg("{op.name}", "{t.name}", {t.name}{flags})')
        for a in op.attrs:
            if a.env:
                given = f'_from_env({a.name}, "{a.env}", {py_literal(a.default)})'
            else:
                given = a.name
            if a.type == "bool":
                call_args.append(f'bool_attr("{op.name}", "{a.name}", {given})')
            elif a.type in ("int", "int64"):
                bits = 32 if a.type == "int" else 64
                call_args.append(f'int_attr("{op.name}", "{a.name}", {given}, {bits})')
            else:
                call_args.append(f"float({given})")
        call = f'run_paddle_op("{op.name}", ' + ", ".join(call_args) + ")"
        if not op.outputs:
            out.append(f"    {call}")
        else:
            n_alloc = len(op.outputs)
            out.append(f"    result = {call}")
            if len(op.outputs) == 1:
                out.append("    return result[0] if isinstance(result, (list, tuple)) else result")
            else:
                items = ", ".join(f"result[{i}]" for i in range(n_alloc))
                out.append(f"    return ({items})")
    out.append("")
    out.append("")
    tables = ["INPLACE_MAPS", "MANUAL_OP_DOCS", "OP_NAMES", "OP_SIGNATURES"]
    exported = [c.python for c in consts] + [e.python for e in enums] + tables
    exported += [op.name for op in ops]
    out.append("__all__ = [" + "".join(f'\n    "{n}",' for n in sorted(exported)) + "\n]")
    out.append("")
    return "\n".join(out)


def gen_sources_cmake(repo: Path, ops: list[Op]) -> str:
    lists: dict[str, list[str]] = {"CPU": [], "GPU": [], "XPU_KERNEL": [], "XPU_EMU": []}
    missing = []
    for op in ops:
        if op.host_only:  # the host function only
            rel = f"custom_ops/cpu/{op.name}.cc"
            lists["CPU"].append(rel)
            if not (repo / rel).exists():
                missing.append(rel)
            continue
        for key, rel in (
            ("CPU", f"custom_ops/cpu/{op.name}.cc"),
            ("GPU", f"custom_ops/gpu/{op.name}.cu"),
            ("XPU_KERNEL", f"custom_ops/xpu/kernel/{op.name}.xpu"),
        ):
            if not (repo / rel).exists():
                missing.append(rel)
            lists[key].append(rel)
        lists["XPU_EMU"].append(f"${{FDMTP_GEN_DIR}}/xpu_emu/{op.name}.cc")
        if not (repo / f"custom_ops/include/fdmtp/{op.name}.h").exists():
            missing.append(f"custom_ops/include/fdmtp/{op.name}.h")
    if missing:
        raise DeclarationError("declared ops lack their kernel files: " + ", ".join(missing))
    out = ["# Generated by custom_ops/codegen/op_codegen.py. Do not edit."]
    # The emulated CUDA units (generated beside this file, in the build folder).
    lists["CUDA_EMU"] = [
        f"${{CMAKE_CURRENT_LIST_DIR}}/cuda_emu/{op.name}.cc" for op in kernel_ops(ops)
    ]
    for key, files in lists.items():
        out.append(f"set(FDMTP_OP_{key}_SOURCES")
        out += [f"  {f}" for f in files]
        out.append(")")
    return "\n".join(out) + "\n"


def gen_xpu_emu_entries(op: Op) -> str:
    """The emulated build's unit for one op's XPU3 kernels: the kernel source compiled as XPU
    device code, plus each kernel's emulator entry (xpu/emu/kp_emu.h)."""
    out = [HEADER, f'#include "xpu/kernel/{op.name}.xpu"', ""]
    out += [f"FDMTP_XPU_EMU_ENTRY({k.split('@')[0]})" for k in op.xpu_kernels]
    return "\n".join(out) + "\n"


# ---- Driver --------------------------------------------------------------------------------


def write_if_changed(path: Path, text: str) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def load_all(repo: Path) -> tuple[list[Op], list[str], list[Constant], list[Enum]]:
    decl_dir = repo / "custom_ops" / "ops"
    ops = []
    manual: list[str] = []
    for path in sorted(decl_dir.glob("*.toml")):
        if path.name == "constants.toml":
            continue
        if path.name == "manual_ops.toml":
            manual = list(tomllib.loads(path.read_text()).get("ops", []))
            continue
        ops.append(load_op(path))
    consts, enums = load_constants(decl_dir / "constants.toml")
    return ops, manual, consts, enums


def generate(repo: Path, out: Path) -> list[Path]:
    ops, manual, consts, enums = load_all(repo)
    sections = doc_sections((repo / "docs" / "ops.md").read_text())
    missing_docs = [op.name for op in ops if op.name not in sections]
    if missing_docs:
        raise DeclarationError(f"docs/ops.md has no `## <op>` section for {missing_docs}")
    files = {
        out / "include" / "fdmtp" / "constants.h": gen_constants_h(consts, enums),
        out / "include" / "fdmtp" / "ops.h": gen_ops_h(ops),
        out / "include" / "fdmtp" / "kernels.h": gen_kernels_h(ops),
        out / "include" / "fdmtp" / "xpu_ops.h": gen_xpu_ops_h(ops),
        out / "entries.cc": gen_entries_cc(ops),
        out / "xpu_plugin.cpp": gen_xpu_plugin_cpp(ops),
        out / "paddle_ops.cc": gen_paddle_cc(ops),
        out / "pybind_ops.cc": gen_pybind_cc(ops),
        out / "generated_ops.h": gen_pybind_h(),
        out / "_op_wrappers.py": gen_python(ops, manual, consts, enums, sections),
        out / "op_sources.cmake": gen_sources_cmake(repo, ops),
    }
    for op in kernel_ops(ops):
        files[out / "cuda_emu" / f"{op.name}.cc"] = gen_cuda_emu_adapter(op)
        files[out / "xpu_emu" / f"{op.name}.cc"] = gen_xpu_emu_entries(op)
    return [path for path, text in files.items() if write_if_changed(path, text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="the repository root")
    parser.add_argument(
        "--out", type=Path, required=True, help="the folder for the generated files"
    )
    args = parser.parse_args(argv)
    try:
        changed = generate(args.repo.resolve(), args.out.resolve())
    except DeclarationError as e:
        print(f"op_codegen: error: {e}", file=sys.stderr)
        return 1
    print(f"op_codegen: {len(changed)} file(s) updated in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
