"""Property-based fuzzing of every declared op through every CPU binding.

For each op, hypothesis draws calls from the op's declaration (``custom_ops/ops/<op>.toml``):
shapes built from the declared shape of each tensor with its symbols (``N``, ``W``, ...)
drawn small, then often perturbed (a dimension off by one or zero, a rank dropped or added,
a wrong dtype, a strided view); values from mixtures of small counts, negatives and the
int32 / int64 extremes; attrs likewise, including values that do not fit their type.

Each call runs in a worker child process (``fuzz_worker.py``) on the framework-free module
(``kernels-cpu``), on the XPU3 kernels under the emulator (``xpu-emu``), on the CUDA
kernels under the CUDA emulator (``cuda-emu``, with its bounds and race checks) and on the
Paddle binding (``cpu``). The outputs an op allocates in Paddle are passed to the
framework-free bindings with the shape and dtype the Paddle binding allocates (from the
declaration's ``alloc``), unless the case perturbs one of them. Every call must end in one
of two ways, the same on every binding:

* a ``ValueError`` whose message starts with ``"<op>: "`` and names one of the op's
  arguments in backticks, with every argument buffer the op was given unchanged (the
  ``cpu`` binding's message must equal ``kernels-cpu``'s); or
* success, with every tensor (the inputs after the op's in-place writes, and the outputs)
  equal on every binding, bit for bit, and, where the case is in the op's contract, equal
  to the numpy reference (``tests/fuzz/references.py``).

Three kinds of case give the ``cpu`` binding another call than the others, so its verdict
is not compared there:

* a perturbed output (wrong shape, dtype or a strided view): the Paddle op allocates its
  own outputs and never sees the caller's. Where both bindings still complete (an output of
  the right element count in another shape), the elements are compared bit for bit.
* a strided view of an input: Paddle's custom-op runtime hands the op a contiguous copy of
  a read-only input, so the op runs (and its results are compared with the reference),
  and the Python wrapper refuses a written one with its own message ("is written in place
  and must be contiguous"); the framework-free module refuses any non-contiguous tensor.
* an optional input given with no elements: a Paddle tensor with no elements holds no
  memory (it is uninitialised), and Paddle's custom-op runtime passes an uninitialised
  optional input to the op as absent (``paddle::none``), so the op takes its path for a
  missing input (and checks nothing about the given one); the framework-free module sees
  the empty tensor. (An op that requires the input then refuses on ``cpu`` only, e.g.
  ``verify_draft_tokens`` with REJECTION and no output rows this step.)

Anything else fails the test: another exception type, a crash of the worker (the case is
reported), a hang past the per-case timeout. Set ``FDMTP_FUZZ_EXAMPLES`` to change the
number of calls per op (default 100); CI runs the default, derandomized, so a failure
reproduces.

Half the calls perturb one tensor and half keep every attr in a small range, so that every
op also completes calls whose results are compared: with 100 calls each op must complete
at least 2 (a generator that only ever produced refusals would compare nothing).
"""

from __future__ import annotations

import os
import pickle
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fastdeploy_mtp
from tests.support.op_declarations import DECLARED, HOST_ONLY, base_dtype

from .fuzz_worker import EVERY_OTHER_ROW
from .references import REFERENCES, compare_with_reference

ROOT = Path(__file__).resolve().parents[2]
# The host-only messaging ops are left out: a call sends to or reads from a system-wide SysV
# message queue (by default queue 1, which a running engine may own), which random calls must
# not touch; they run one host function on every backend, tested with their own queues in
# tests/ops/test_messaging.py.
DECLS = {name: decl for name, decl in DECLARED.items() if name not in HOST_ONLY}
EXAMPLES = int(os.environ.get("FDMTP_FUZZ_EXAMPLES", "100"))
CASE_TIMEOUT_S = float(os.environ.get("FDMTP_FUZZ_CASE_TIMEOUT", "60"))
BACKENDS = ("kernels-cpu", "xpu-emu", "cuda-emu", "cpu")
SYMBOLS = (
    "N",
    "W",
    "K",
    "L",
    "L2",
    "C",
    "T",
    "E",
    "F",
    "B",
    "R",
    "V",
    "H",
    "rows",
    "num_tokens",
    "real_bsz",
)
INT_DTYPES = {
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
    "float32": np.float32,
    "int8": np.int8,
}
STATS: dict[str, int] = {
    "cases": 0,
    "rejected": 0,
    "ok": 0,
    "crashes": 0,
    "hangs": 0,
    "lost_writes": 0,
}
#: per op, the calls that completed on kernels-cpu (whose results were compared)
COMPLETED: dict[str, int] = {}


def _paddle_available() -> bool:
    try:
        import paddle  # noqa: F401
    except ImportError:
        return False
    return True


class Worker:
    """A child process running cases; restarted after a crash or a hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        package_root = str(Path(fastdeploy_mtp.__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, str(ROOT)]))
        return subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__).with_name("fuzz_worker.py"))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        )  # fmt: skip

    def run(self, case: tuple) -> tuple:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        data = pickle.dumps(_encode_views(case))
        try:
            proc.stdin.write(struct.pack("<Q", len(data)) + data)
            proc.stdin.flush()
        except BrokenPipeError:
            return self._died(case)
        reader = _Reader(proc.stdout)
        header = reader.read(8, CASE_TIMEOUT_S)
        if header is None:
            if proc.poll() is None:
                self.close()
                STATS["hangs"] += 1
                return ("hang", f"no answer within {CASE_TIMEOUT_S} s")
            return self._died(case)
        (size,) = struct.unpack("<Q", header)
        body = reader.read(size, CASE_TIMEOUT_S)
        assert body is not None
        return pickle.loads(body)

    def _died(self, case: tuple) -> tuple:
        assert self.proc is not None
        self.proc.wait(timeout=30)
        stderr = (
            self.proc.stderr.read().decode(errors="replace")[-4000:] if self.proc.stderr else ""
        )
        code = self.proc.returncode
        self.proc = None
        STATS["crashes"] += 1
        return ("crash", f"worker died with exit code {code}:\n{stderr}")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None


def _encode_views(case: tuple) -> tuple:
    """Pickling a strided view sends a contiguous copy: the fuzzer's views (``base[::2]``)
    travel as ``(EVERY_OTHER_ROW, base)`` instead, and the worker takes the view again."""

    def encode(a):
        if a is None or a.flags.c_contiguous:
            return a
        assert a.base is not None and a.base[::2].shape == a.shape and np.shares_memory(a, a.base)
        return (EVERY_OTHER_ROW, a.base)

    op, backend, tensors, attrs, outputs = case
    return (
        op,
        backend,
        {k: encode(v) for k, v in tensors.items()},
        attrs,
        {k: encode(v) for k, v in outputs.items()},
    )


class _Reader:
    def __init__(self, stream) -> None:
        self.stream = stream

    def read(self, n: int, timeout: float) -> bytes | None:
        import select

        chunks = []
        remaining = n
        while remaining:
            ready, _, _ = select.select([self.stream], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.stream.fileno(), remaining)
            if not chunk:
                return None
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


# ---- case generation -------------------------------------------------------------------------


def _dims(shape: str, sym: dict[str, int], draw) -> list[int]:
    text = shape.split(" or ")[0].split(" (")[0].strip().strip("[]")
    if not text:
        return []
    dims = []
    for part in text.split(","):
        expr = part.strip().removeprefix(">=").strip()
        try:
            value = int(eval(expr, {"__builtins__": {}}, sym))  # noqa: S307 - our own declarations
        except Exception:  # noqa: BLE001 - a symbol we do not model: any small size
            value = draw(st.integers(0, 6))
        dims.append(max(value, 0))
    return dims


def _allocated(alloc: list[str] | str, tensors: dict, attrs: dict) -> list[int]:
    """An output's shape as the Paddle binding allocates it from its declared ``alloc`` (C++
    dim expressions over ``Dim(<input>, i)`` and attrs, or ``like:<input>``): a dimension an
    input does not have is -1, and negative dimensions become 0 (``pb::Allocatable``)."""

    def dim(a: np.ndarray, i: int) -> int:
        return a.shape[i] if i < a.ndim else -1

    if isinstance(alloc, str):
        dims = list(tensors[alloc.removeprefix("like:")].shape)
    else:
        env = {"Dim": dim, **tensors, **attrs}
        dims = [int(eval(d, {"__builtins__": {}}, env)) for d in alloc]  # noqa: S307 - our own declarations
    return [max(d, 0) for d in dims]


FLOAT_DTYPES = [np.float32, np.float16, np.uint16]  # uint16 = bfloat16 bits


def _dtype_of(decl: dict, dtype: str, draw, floats: type = np.float32) -> type:
    """``floats``: the call's float dtype (one per call: an op's float tensors share theirs)."""
    dtype = base_dtype(decl, dtype)
    if dtype == "float":
        return floats
    if dtype == "any":
        return draw(st.sampled_from([np.int32, np.int64]))
    return INT_DTYPES[dtype]


def _values(rng: np.random.Generator, shape: list[int], dtype: type, mode: str) -> np.ndarray:
    # an array also for shape [] (a comparison of a 0-d array gives a numpy scalar)
    return np.array(_draw_values(rng, shape, dtype, mode), dtype=dtype)


def _draw_values(rng: np.random.Generator, shape: list[int], dtype: type, mode: str) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if dtype is np.bool_:
        return rng.random(n).reshape(shape) < 0.5
    if dtype in (np.float32, np.float16):
        a = rng.standard_normal(n).astype(dtype)
        if mode == "extreme" and n:
            a[rng.integers(0, n)] = np.nan
        return a.reshape(shape)
    if dtype is np.uint16:
        return rng.integers(0, 1 << 16, n, dtype=np.uint16).reshape(shape)
    info = np.iinfo(dtype)
    if mode == "small":
        a = rng.integers(0, 9, n)
    elif mode == "signed":
        a = rng.integers(-3, 9, n)
    else:
        pool = np.array(
            [info.min, -1, 0, 1, 2, 5, info.max, info.max - 1, 2**31 - 1 if info.bits == 64 else 7]
        )
        a = rng.choice(pool, n)
    return a.astype(dtype).reshape(shape)


ATTR_EXTREMES = [-1, 2**31 - 1, -(2**31), 2**31, 2**40]


@st.composite
def calls(draw, op: str) -> tuple[dict, dict, dict, bool, bool]:
    decl = DECLS[op]
    sym = {s: draw(st.integers(0, 6)) for s in SYMBOLS}
    if draw(st.integers(0, 3)):  # mostly a batch that fits its slots (else: refused)
        sym["real_bsz"] = min(sym["real_bsz"], sym["N"])
    alloc_attrs = {
        a for o in decl.get("outputs", []) for a in re.findall(r"[a-z_]+", str(o["alloc"]))
    }
    attrs = {}
    # half the calls keep every attr in a small valid-looking range (else a call with several
    # attrs almost never gets past their checks, and its results are never compared)
    sane = draw(st.booleans())
    for a in decl.get("attrs", []):
        if a["type"] == "bool":
            attrs[a["name"]] = draw(st.booleans())
        elif a["name"] in alloc_attrs:
            extremes = st.sampled_from([-1, 1 << 16])
            attrs[a["name"]] = draw(
                st.integers(0, 24) if sane else st.one_of(st.integers(0, 24), extremes)
            )
        elif sane:
            attrs[a["name"]] = draw(st.integers(0, 5))
        else:
            attrs[a["name"]] = draw(
                st.one_of(st.integers(0, 6), st.integers(-2, 8), st.sampled_from(ATTR_EXTREMES))
            )
    floats = draw(st.sampled_from(FLOAT_DTYPES))
    sym.update({k: v for k, v in attrs.items() if isinstance(v, int) and 0 <= v < 64})
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mode = draw(st.sampled_from(["small", "small", "signed", "extreme"]))
    names = [t["name"] for t in decl["inputs"]] + [o["name"] for o in decl.get("outputs", [])]
    # half the calls perturb one tensor (whatever the op's number of tensors), half none
    mutated = draw(st.one_of(st.none(), st.sampled_from(names)))
    strided = False
    own_outputs = False  # outputs that differ from what the Paddle binding allocates
    tensors, outputs = {}, {}
    for spec in [*decl["inputs"], *decl.get("outputs", [])]:
        is_output = spec in decl.get("outputs", [])
        if (
            spec.get("optional") and draw(st.integers(0, 3)) == 0
        ):  # absent in a quarter of the calls
            tensors[spec["name"]] = None
            continue
        if is_output:
            # the shape and dtype the Paddle binding allocates (so both bindings get the same
            # outputs), unless this output is mutated below
            shape = _allocated(spec["alloc"], tensors, attrs)
            like = spec["dtype"].removeprefix("same:")
            dtype = (
                tensors[like].dtype.type
                if like in tensors
                else _dtype_of(decl, spec["dtype"], draw, floats)
            )
        else:
            shape = _dims(spec["shape"], sym, draw)
            dtype = _dtype_of(decl, spec["dtype"], draw, floats)
        if spec["name"] == mutated:
            unmutated = (list(shape), dtype)
            kind = draw(st.sampled_from(["dim", "rank+", "rank-", "dtype", "stride"]))
            if kind == "dim" and shape:
                i = draw(st.integers(0, len(shape) - 1))
                shape[i] = max(shape[i] + draw(st.sampled_from([-1, 1, 3])), 0)
            elif kind == "rank+":
                shape = [*shape, draw(st.integers(1, 3))]
            elif kind == "rank-" and shape:
                shape = shape[:-1]
            elif kind == "dtype":
                dtype = draw(st.sampled_from([np.int32, np.int64, np.float32, np.bool_, np.int8]))
            elif kind == "stride" and shape and shape[0] > 0:
                base = _values(rng, [shape[0] * 2, *shape[1:]], dtype, mode)
                array = base[::2]
                strided = True
                own_outputs |= is_output
                (outputs if is_output else tensors)[spec["name"]] = array
                continue
            own_outputs |= is_output and (list(shape), dtype) != unmutated
        (outputs if is_output else tensors)[spec["name"]] = _values(rng, shape, dtype, mode)
    return tensors, attrs, outputs, strided, own_outputs


def _named_argument(op: str, message: str) -> bool:
    decl = DECLS[op]
    names = {t["name"] for t in decl["inputs"]} | {a["name"] for a in decl.get("attrs", [])}
    names |= {o["name"] for o in decl.get("outputs", [])}
    return any(f"`{n}`" in message for n in names)


def _check_verdict(op: str, backend: str, verdict: tuple, case_repr: str) -> None:
    STATS["cases"] += 1
    kind = verdict[0]
    assert kind in ("error", "ok"), f"{op} on {backend}: {kind}: {verdict[1:]}\ncase: {case_repr}"
    if kind == "error":
        STATS["rejected"] += 1
        message, changed = verdict[1], verdict[2]
        assert message.startswith(f"{op}: "), (
            f"{op} on {backend}: message does not name the op: {message!r}"
        )
        assert _named_argument(op, message), (
            f"{op} on {backend}: message names no argument: {message!r}"
        )
        if changed:
            STATS["lost_writes"] += 1
        assert not changed, (
            f"{op} on {backend}: rejected call changed {changed}: {message}\ncase: {case_repr}"
        )
    else:
        STATS["ok"] += 1


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    )


def _same_elements(a, b) -> bool:
    """The same dtype and elements, bit for bit, whatever the shapes."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.size == b.size and _same(a.reshape(-1), b.reshape(-1))


@pytest.mark.parametrize("op", sorted(DECLS))
def test_fuzz_op(op, worker):
    backends = [b for b in BACKENDS if b != "cpu" or _paddle_available()]
    optional = [t["name"] for t in DECLS[op]["inputs"] if t.get("optional")]

    @settings(
        max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
        suppress_health_check=[
            HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much
        ],
    )  # fmt: skip
    @given(calls(op))
    def check(call):
        tensors, attrs, outputs, strided, own_outputs = call
        shapes = {
            k: (None if v is None else (v.dtype.str, v.shape))
            for k, v in {**tensors, **outputs}.items()
        }
        case_repr = repr({"attrs": attrs, "shapes": shapes})
        verdicts = {}
        for backend in backends:
            if backend == "cpu" and outputs:
                # the Paddle op allocates its outputs: it gets the inputs only
                verdict = worker.run((op, backend, tensors, attrs, {}))
            else:
                verdict = worker.run((op, backend, tensors, attrs, outputs))
            _check_verdict(op, backend, verdict, case_repr)
            verdicts[backend] = verdict
        # The Paddle binding is compared too, except where it sees another call than the others
        # (see the module docstring).
        empty_optional = any(
            tensors[name] is not None and tensors[name].size == 0 for name in optional
        )
        comparable = [
            b for b in verdicts if not (b == "cpu" and (strided or own_outputs or empty_optional))
        ]
        kinds = {b: verdicts[b][0] for b in comparable}
        assert len(set(kinds.values())) <= 1, (
            f"{op}: bindings disagree {kinds} on {case_repr}: {verdicts}"
        )
        if "cpu" in comparable and verdicts["cpu"][0] == "error":
            got, want = verdicts["cpu"][1], verdicts["kernels-cpu"][1]
            assert got == want, (
                f"{op}: cpu refuses with {got!r}, kernels-cpu with {want!r}\ncase: {case_repr}"
            )
        first = verdicts["kernels-cpu"]
        if first[0] == "ok":
            COMPLETED[op] = COMPLETED.get(op, 0) + 1
            for backend in ("xpu-emu", "cuda-emu"):
                other = verdicts[backend][1]
                for name, value in first[1].items():
                    assert _same(value, other[name]), (
                        f"{op}: `{name}` differs between kernels-cpu and {backend}"
                    )
            if verdicts.get("cpu", ("",))[0] == "ok":
                paddle = verdicts["cpu"][1]
                assert paddle.keys() == first[1].keys(), f"{op}: cpu returned {sorted(paddle)}"
                for name, value in first[1].items():
                    # an output of the caller's own may have another shape of the same count
                    same = _same_elements if own_outputs and name in outputs else _same
                    assert same(value, paddle[name]), (
                        f"{op}: `{name}` differs between kernels-cpu and cpu: {case_repr}"
                    )
            if op in REFERENCES and not strided:
                compare_with_reference(op, tensors, attrs, outputs, first[1])
        elif (
            strided
            and not empty_optional
            and verdicts.get("cpu", ("",))[0] == "ok"
            and op in REFERENCES
        ):
            # a strided read-only input: the Paddle op ran on a contiguous copy of it
            compare_with_reference(op, tensors, attrs, outputs, verdicts["cpu"][1])

    check()
    if EXAMPLES >= 50:
        assert COMPLETED.get(op, 0) >= EXAMPLES // 50, (
            f"{op}: only {COMPLETED.get(op, 0)} of {EXAMPLES} calls completed"
        )
