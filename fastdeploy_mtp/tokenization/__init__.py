"""Tokenizers of model folders (``tokenizer.json`` + ``tokenizer_config.json``), their chat
templates, streaming detokenization and the generation defaults of
``generation_config.json``."""

from .chat_template import ChatTemplateError, render_chat_template
from .detokenizer import IncrementalDetokenizer
from .generation_defaults import GENERATION_CONFIG_FILE, GenerationDefaults, load_generation_config
from .tokenizer import (
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    Tokenizer,
    TokenizerFileError,
    byte_level_chars,
    load_tokenizer,
)

__all__ = [
    "GENERATION_CONFIG_FILE",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "ChatTemplateError",
    "GenerationDefaults",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerFileError",
    "byte_level_chars",
    "load_generation_config",
    "load_tokenizer",
    "render_chat_template",
]
