"""What the tests of a model folder served end to end share: the CLI run in this process
(:func:`run_cli`), a ``generate --json`` runner that runs each distinct call once
(:func:`json_generator`; as the module fixture ``generate``: :func:`generate_fixture`), the
module fixtures ``folder`` and ``tokenizer`` (:func:`folder_fixtures`), the check that
``generate`` gives a reference's greedy tokens (:func:`check_generate_equals_reference`) and
the check that greedy completions through a server or a router answer exactly as ``generate``
(:func:`check_greedy_equals_generate`)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import ServerProcess, serving

#: ``generate(prompt, *flags, model=folder)``: the parsed ``generate --json`` output
Generate = Callable[..., dict[str, Any]]

#: The MoE and latent-attention families' TP 2 checks (GLM-4.5, DeepSeek-V3): MTP with K = 2,
#: greedy completions of ``K2_PROMPTS``, ``K2_MAX_TOKENS`` tokens at most
K2_MTP = '{"method": "mtp", "num_speculative_tokens": 2}'
K2_PROMPTS = ["Speculative decoding drafts", "The quick brown fox"]
K2_MAX_TOKENS = 16


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``fastdeploy-mtp *argv`` in this process: (exit status, stdout, stderr)."""
    from fastdeploy_mtp.entrypoints.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def json_generator(folder: str, spec: str, max_tokens: int, *flags: str) -> Generate:
    """``generate(prompt, *more, model=folder)``: ``fastdeploy-mtp generate --json`` of
    ``prompt`` with speculation ``spec`` and ``max_tokens``, then ``flags`` and ``more``, on
    ``model`` (``None``: the shipped model), parsed; each distinct call runs once."""
    done: dict[tuple[Any, ...], dict[str, Any]] = {}

    def run(prompt: str, *more: str, model: str | None = folder) -> dict[str, Any]:
        key = (prompt, more, model)
        if key not in done:
            argv = ["generate", "--prompt", prompt, "--max-tokens", str(max_tokens)]
            argv += ["--speculative-config", spec, *flags, *more, "--json"]
            code, out, err = run_cli([*argv, *(["--model", model] if model else [])])
            assert code == 0, err
            done[key] = json.loads(out)
        return done[key]

    return run


def generate_fixture(spec: str, max_tokens: int, *flags: str) -> Any:
    """The module fixture ``generate`` (for a test module to bind under that name): the
    :func:`json_generator` of the module's ``folder`` fixture."""

    @pytest.fixture(scope="module")
    def generate(folder: str) -> Generate:
        return json_generator(folder, spec, max_tokens, *flags)

    return generate


def tp2_server_fixture(spec: str, *flags: str) -> Any:
    """The module fixture ``server`` (for a test module to bind under that name): ``serve``
    of the module's ``folder`` fixture with speculation ``spec`` at tensor-parallel size 2,
    plus ``flags``."""

    @pytest.fixture(scope="module")
    def server(folder: str) -> Iterator[ServerProcess]:
        args = [folder, "--speculative-config", spec, "--tensor-parallel-size", "2", *flags]
        yield from serving(args)

    return server


def folder_fixtures(name: str, make: Callable[[Path], object]) -> tuple[Any, Any]:
    """The module fixtures ``(folder, tokenizer)``, for a test module to bind under those
    names: ``folder`` is the path of a fresh temporary folder (``name``) that ``make`` wrote
    the model into, ``tokenizer`` that folder's tokenizer."""

    @pytest.fixture(scope="module")
    def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
        out = tmp_path_factory.mktemp(name)
        make(out)
        return str(out)

    @pytest.fixture(scope="module")
    def tokenizer(folder: str) -> Any:
        from fastdeploy_mtp.tokenization import load_tokenizer

        return load_tokenizer(folder)

    return folder, tokenizer


def check_greedy_equals_generate(
    url: str, model: str, prompts: list[str], max_tokens: int, generate: Generate
) -> None:
    """A greedy completion of each prompt through ``url`` (a server or a router, asked for
    ``model``) has ``generate(prompt)``'s text, finish reason and number of tokens."""
    import openai

    c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for prompt in prompts:
        want = generate(prompt)
        got = c.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
        choice = got.choices[0]
        assert (choice.text, choice.finish_reason) == (want["text"], want["finish_reason"]), prompt
        assert got.usage.completion_tokens == len(want["token_ids"]), prompt


def check_generate_equals_reference(
    generate: Generate,
    tokenizer: Any,
    prompts: list[str],
    reference: Callable[[list[int]], list[int]],
    eos: int,
) -> None:
    """``generate(prompt)``'s token ids are ``reference(prompt ids)``'s greedy ones, up to and
    including the first ``eos`` (the folder's EOS id ends the request) for each prompt."""
    for prompt in prompts:
        ids = generate(prompt)["token_ids"]
        want = reference(tokenizer.encode(prompt))
        if eos in want:
            want = want[: want.index(eos) + 1]
        assert ids == want, prompt
