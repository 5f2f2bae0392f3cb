"""The training corpus of the shipped tiny checkpoint: the Python standard library's own
top-level ``*.py`` files, split by file into train and held-out sets.

A file is held out when ``int(sha1(name).hexdigest(), 16) % 10 == 0`` (``name`` is the file
name relative to the stdlib directory, e.g. ``"argparse.py"``), about 10% of the files.
Bytes are the vocabulary (ids 0..255), so the text is used as raw UTF-8 bytes.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass

import numpy as np

#: One held-out file in ``HELDOUT_MODULO`` (by hash of the relative path).
HELDOUT_MODULO = 10


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def is_heldout(name: str) -> bool:
    """Whether the stdlib file ``name`` (relative path) belongs to the held-out split."""
    return int(hashlib.sha1(name.encode("utf-8")).hexdigest(), 16) % HELDOUT_MODULO == 0


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
