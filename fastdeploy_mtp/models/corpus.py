"""The training corpus of the shipped tiny checkpoint: the Python standard library's own
top-level ``*.py`` files, split by file into train and held-out sets.

A file is held out when ``int(sha1(name).hexdigest(), 16) % 10 == 0`` (``name`` is the file
name relative to the stdlib directory, e.g. ``"argparse.py"``), about 10% of the files.
Bytes are the vocabulary (ids 0..255), so the text is used as raw UTF-8 bytes.

The training stream (:meth:`CorpusSplit.documents_array`) cuts each file into documents the
size of an answer (:func:`documents`: every top-level ``def``/``class`` with its decorators,
and each run of other top-level statements between them) and ends each one with the
end-of-text id :data:`EOT_ID`, so a model learns where a function or class ends.
"""

from __future__ import annotations

import ast
import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass

import numpy as np

#: One held-out file in ``HELDOUT_MODULO`` (by hash of the relative path).
HELDOUT_MODULO = 10
#: The end-of-text token (``<|endoftext|>``) after each document: the first id past the bytes.
EOT_ID = 256


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def is_heldout(name: str) -> bool:
    """Whether the stdlib file ``name`` (relative path) belongs to the held-out split."""
    return int(hashlib.sha1(name.encode("utf-8")).hexdigest(), 16) % HELDOUT_MODULO == 0


def documents(source: bytes) -> list[bytes]:
    """``source`` (one Python file's bytes) cut at top-level blocks: each top-level ``def``,
    ``async def`` or ``class`` from its first decorator to its last line is a document, and so
    is each run of other lines between two of them (imports, assignments, comments). Blank
    lines at a document's start and end are dropped and each document ends with one newline.
    A file that does not parse is one document."""
    try:
        body = ast.parse(source).body
    except (SyntaxError, ValueError):
        body = []
    lines = source.splitlines(keepends=True)
    cuts = {0, len(lines)}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            cuts.add(min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1)
            cuts.add(node.end_lineno or node.lineno)
    edges = sorted(cuts)
    out = []
    for start, end in zip(edges, edges[1:]):
        while start < end and not lines[start].strip():
            start += 1
        while end > start and not lines[end - 1].strip():
            end -= 1
        if start < end:
            out.append(b"".join(lines[start:end]).rstrip(b"\r\n") + b"\n")
    return out


@dataclass
class CorpusSplit:
    """File lists (relative names, sorted) of each split and the directory they live in."""

    root: str
    train_files: list[str]
    heldout_files: list[str]

    def _concat(self, names: list[str]) -> np.ndarray:
        chunks = []
        for name in names:
            with open(os.path.join(self.root, name), "rb") as f:
                chunks.append(np.frombuffer(f.read(), dtype=np.uint8))
        return np.concatenate(chunks) if chunks else np.zeros([0], np.uint8)

    def documents_array(self, names: list[str]) -> np.ndarray:
        """The :func:`documents` of the files ``names`` in order, each followed by
        :data:`EOT_ID`: ``[N]`` int64 token ids."""
        ids: list[int] = []
        for name in names:
            with open(os.path.join(self.root, name), "rb") as f:
                for doc in documents(f.read()):
                    ids.extend(doc)
                    ids.append(EOT_ID)
        return np.asarray(ids, np.int64)

    def train_array(self) -> np.ndarray:
        """All train files concatenated in name order, ``[N]`` uint8."""
        return self._concat(self.train_files)

    def heldout_array(self) -> np.ndarray:
        """All held-out files concatenated in name order, ``[N]`` uint8."""
        return self._concat(self.heldout_files)

    def describe(self) -> dict[str, object]:
        def size(names: list[str]) -> int:
            return sum(os.path.getsize(os.path.join(self.root, n)) for n in names)

        return {
            "source": "top-level *.py files of the Python standard library",
            "python_version": platform.python_version(),
            "stdlib_dir": self.root,
            "split_rule": "held out iff int(sha1(relative_name).hexdigest(), 16) "
            f"% {HELDOUT_MODULO} == 0",
            "train_files": len(self.train_files),
            "train_bytes": size(self.train_files),
            "heldout_files": len(self.heldout_files),
            "heldout_bytes": size(self.heldout_files),
        }


def load_split(root: str | None = None) -> CorpusSplit:
    """List the top-level ``*.py`` files under ``root`` (default: this interpreter's stdlib)
    and split them."""
    root = root or stdlib_dir()
    names = sorted(
        n for n in os.listdir(root) if n.endswith(".py") and os.path.isfile(os.path.join(root, n))
    )
    if not names:
        raise FileNotFoundError(f"no *.py files found under stdlib directory {root!r}")
    heldout = [n for n in names if is_heldout(n)]
    train = [n for n in names if not is_heldout(n)]
    return CorpusSplit(root, train, heldout)
