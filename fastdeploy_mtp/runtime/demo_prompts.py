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
