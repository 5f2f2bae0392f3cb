"""Prompts bundled with the demo: openings of Python code in the style of the standard
library (the shipped tiny model was trained on it)."""

DEMO_PROMPTS = [
    "import os\nimport sys\n\n\ndef main():\n    ",
    'class Stack:\n    """A last-in first-out container."""\n\n    def __init__(self):\n        ',
    "def read_lines(path):\n    with open(path) as f:\n        ",
    "    for i in range(len(items)):\n        if items[i] is None:\n            ",
    "        except KeyError:\n            raise ValueError(",
    "def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, ",
    "    @property\n    def name(self):\n        ",
    "if __name__ == '__main__':\n    ",
]


#: Held-out files the held-out prompts come from, and the text each prompt ends with.
HELDOUT_SOURCES = (
    ("dataclasses.py", "\n    def "),
    ("subprocess.py", "\n        if "),
    ("contextlib.py", "\n    def "),
    ("dataclasses.py", "\n        if "),
    ("subprocess.py", "\n    def "),
    ("contextlib.py", "\n        if "),
)


def heldout_prompts(prompt_bytes: int = 96, offset: int = 6000) -> list[str]:
    """Prompts the shipped model never trained on: the ``prompt_bytes`` bytes of a held-out
    standard-library file (see :mod:`fastdeploy_mtp.models.corpus`) that end at the first
    ``"def "`` / ``"if "`` of :data:`HELDOUT_SOURCES` after byte ``offset``.

    Raises:
        FileNotFoundError: this Python has no such standard-library file.
        ValueError: a file that is not held out, or has no such text after ``offset``.
    """
    import os

    from ..models import corpus

    split = corpus.load_split()
    out = []
    for name, ending in HELDOUT_SOURCES:
        if name not in split.heldout_files:
            raise ValueError(f"{name} is not in the held-out split")
        with open(os.path.join(split.root, name), encoding="utf-8") as f:
            text = f.read()
        end = text.index(ending, offset) + len(ending)
        out.append(text[end - prompt_bytes : end])
    return out
