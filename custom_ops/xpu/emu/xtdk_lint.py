"""XTDK dialect lint for the XPU3 kernel sources (custom_ops/xpu/kernel/*.xpu and *.h, and
the shared per-item headers of custom_ops/include/fdmtp/ that they run).

The emulated build checks what g++'s types can (global-memory pointer qualifiers, kernel
parameter types: see xpu/emu/kp_emu.h). This script checks the rest of the dialect that
FastDeploy's XPU3 kernels keep to and that the Kunlun XTDK compiler needs in device code:

  no-lambda            no lambda expressions (use a functor struct or an explicit loop)
  no-function-pointer  no function pointers: no function-pointer types, and no device
                       function (FDMTP_HOST_DEVICE / __device__ / __global__) named as a value
  no-std               no standard-library or C-library calls (std::..., memcpy, printf, ...)

Comments, string and character literals are ignored. Usage:
  python xtdk_lint.py FILE... [--device-headers DIR]
Prints `file:line: rule: message` for each violation and exits 1 if there is any.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

C_LIBRARY_CALLS = (
    "memcpy",
    "memset",
    "memmove",
    "printf",
    "fprintf",
    "malloc",
    "free",
    "abort",
    "assert",
    "exit",
)

_LAMBDA = re.compile(
    r"\[\s*(?:[&=]|this|[&=]?\s*\w+(?:\s*,\s*[&=]?\s*\w+)*)?\s*\]\s*(?:\(|\{|mutable\b|->)"
)
_FN_PTR_TYPE = re.compile(r"\(\s*(?:\w+\s*::\s*)*\*\s*\w*\s*\)\s*\(")
_STD = re.compile(r"(?<![\w:])(?:::\s*)?std\s*::")
_C_CALL = re.compile(r"(?<![\w:.>])(?:::\s*)?(" + "|".join(C_LIBRARY_CALLS) + r")\s*\(")
_QUALIFIER = r"(?:FDMTP_HOST_DEVICE|__device__|__global__)"
_DEVICE_FN = re.compile(_QUALIFIER + r"\s+(?:static\s+)?(?:inline\s+)?[\w:<>,\s*&]*?\b(\w+)\s*\(")


def strip_comments_and_literals(text: str) -> str:
    """`text` with comments, string and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
        elif c == "#" and (
            i == 0 or text[i - 1] == "\n"
        ):  # preprocessor line: keep, but not #include
            j = text.find("\n", i)
            j = n if j < 0 else j
            line = text[i:j]
            out.append(" " * len(line) if line.lstrip("#").lstrip().startswith("include") else line)
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def device_functions(paths: list[Path]) -> set[str]:
    names: set[str] = set()
    for p in paths:
        names.update(_DEVICE_FN.findall(strip_comments_and_literals(p.read_text())))
    names.discard("operator")
    return names


def lint_text(path: str, text: str, device_fns: set[str]) -> list[str]:
    code = strip_comments_and_literals(text)
    errors = []

    def report(pos: int, rule: str, message: str) -> None:
        errors.append(f"{path}:{code.count(chr(10), 0, pos) + 1}: {rule}: {message}")

    for m in _LAMBDA.finditer(code):
        before = code[: m.start()].rstrip()
        if before and (before[-1].isalnum() or before[-1] in "_])"):
            continue  # a subscript, not a lambda introducer
        report(
            m.start(), "no-lambda", "lambda expression in XPU device code (use a functor struct)"
        )
    for m in _FN_PTR_TYPE.finditer(code):
        report(m.start(), "no-function-pointer", "function-pointer type in XPU device code")
    for m in _STD.finditer(code):
        report(m.start(), "no-std", "standard-library call in XPU device code")
    for m in _C_CALL.finditer(code):
        report(m.start(), "no-std", f"C-library call `{m.group(1)}` in XPU device code")
    if device_fns:
        names = "|".join(sorted(map(re.escape, device_fns), key=len, reverse=True))
        value = re.compile(r"(?<![\w.>])(?:\w+\s*::\s*)*(" + names + r")\b(?!\s*(?:\(|<|::))")
        for m in value.finditer(code):
            before = code[: m.start()].rstrip()
            after = code[m.end() :].lstrip()
            if before.endswith(("struct", "class", "enum", "namespace")) or after.startswith(
                (";", "{")
            ):
                continue  # a declaration of the name, not a use as a value
            if re.search(_QUALIFIER + r"[\w\s:<>,*&]*$", before):
                continue  # the function's own declarator
            message = f"device function `{m.group(1)}` used as a value (function pointer)"
            report(m.start(), "no-function-pointer", message)
    return errors


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument(
        "--device-headers",
        type=Path,
        default=here.parent.parent / "include" / "fdmtp",
        help="the shared per-item headers whose device functions may not be used as values",
    )
    args = parser.parse_args(argv)
    headers = sorted(args.device_headers.glob("*.h")) if args.device_headers.is_dir() else []
    device_fns = device_functions(headers + list(args.files))
    errors: list[str] = []
    for f in args.files:
        errors += lint_text(str(f), f.read_text(), device_fns)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(
            f"xtdk_lint: {len(errors)} violation(s) of the XPU3 device-code dialect",
            file=sys.stderr,
        )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
