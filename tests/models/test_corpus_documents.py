"""The training corpus read as documents: each top-level ``def``/``class`` (with its
decorators) and each run of other top-level lines is one document, blank lines around them
dropped, and the documents stream ends every document with the end-of-text id."""

import numpy as np

from fastdeploy_mtp.models.corpus import EOT_ID, CorpusSplit, documents

SOURCE = b'''"""Module doc."""
import os


# a comment above
@decorator
@other(1)
def first(a, b):
    x = a

    return x + b


X = 1
class Second:
    def method(self):
        pass
if __name__ == "__main__":
    first(1, 2)
'''


def test_top_level_blocks_and_runs_of_other_lines_are_documents():
    assert documents(SOURCE) == [
        b'"""Module doc."""\nimport os\n\n\n# a comment above\n',
        b"@decorator\n@other(1)\ndef first(a, b):\n    x = a\n\n    return x + b\n",
        b"X = 1\n",
        b"class Second:\n    def method(self):\n        pass\n",
        b'if __name__ == "__main__":\n    first(1, 2)\n',
    ]


def test_a_file_that_does_not_parse_is_one_document():
    assert documents(b"\n\ndef broken(:\n    pass\n\n") == [b"def broken(:\n    pass\n"]
    assert documents(b"\n \n") == []


def test_documents_stream_ends_each_document_with_eot(tmp_path):
    (tmp_path / "a.py").write_bytes(b"def f():\n    return 1\n\n\nY = 2\n")
    (tmp_path / "b.py").write_bytes(b"Z = 3")
    stream = CorpusSplit(str(tmp_path), ["a.py", "b.py"], []).documents_array(["a.py", "b.py"])
    assert stream.dtype == np.int64
    want = [*b"def f():\n    return 1\n", EOT_ID, *b"Y = 2\n", EOT_ID, *b"Z = 3\n", EOT_ID]
    assert stream.tolist() == want
