"""``fastdeploy-mtp``: run the shipped tiny checkpoint with and without MTP speculation.

  fastdeploy-mtp demo [--model DIR] [SPECULATION] [--max-tokens N] [--max-num-seqs N]
                      [--temperature T --seed S] [--json] [--plot FILE]
  fastdeploy-mtp generate --prompt TEXT [--model DIR] [SPECULATION] [--max-tokens N]
                          [SAMPLING] [--json]
  fastdeploy-mtp serve [DIR | --model DIR] [SPECULATION] [--port P]
                       [--splitwise-role mixed|prefill|decode] ...
  fastdeploy-mtp router --prefill URL --decode URL [--port P] ...
  fastdeploy-mtp --version

--model DIR: a model folder in HuggingFace layout (config.json, safetensors weights,
tokenizer.json, tokenizer_config.json, generation_config.json; default: the shipped one), with
--tokenizer DIR (another folder's tokenizer files) and --dtype auto|float32|bfloat16|float16;
a folder that cannot be served is refused before anything loads. `--checkpoint DIR`, the old
spelling on demo and generate, still works and says it is deprecated.

SPECULATION is --speculative-config JSON with FastDeploy's keys, e.g.
  '{"method": "mtp", "num_speculative_tokens": 3, "num_model_steps": 1,
    "mtp_strategy": "with_ngram"}'
or the shorthand flags --num-speculative-tokens K, --num-model-steps S, --hybrid-ngram. Keys
the JSON leaves out take the flags' values (or their defaults); a flag that contradicts the
JSON is an error. Every command refuses the same values the same way.

SAMPLING (default greedy): --temperature, --top-p, --top-k, --min-p, --seed,
--repetition-penalty, --frequency-penalty, --presence-penalty, --stop TEXT (repeatable),
--logprobs K. A seeded request samples the same tokens with and without speculation
(verify_strategy "target_match", the default).

Errors are one line on stderr, exit status 2 for a bad argument, 1 for a failure while
running; Ctrl-C (at any moment) prints one line and exits with status 130. FDMTP_DEBUG=1
shows the traceback instead.
"""

# Only the standard library at module level: ``main`` holds SIGINT and SIGTERM back before
# the package's imports (numpy's among them) start a thread; see ``main``.

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from typing import NoReturn

#: the signals ``main`` holds back until the command starts
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are :class:`UsageError` (``main`` prints them as
    one line) instead of a usage dump and ``SystemExit``."""

    def error(self, message: str) -> NoReturn:
        from ..engine_args import UsageError

        raise UsageError(f"{message} (see `{self.prog} --help`)")


def package_version() -> str:
    """The installed distribution's version, or ``fastdeploy_mtp.__version__`` when the
    package runs from a source tree that was not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fastdeploy_mtp")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The ``fastdeploy-mtp`` argument parser (its errors raise :class:`UsageError`)."""
    from . import check_drafts, demo, generate, router, serve

    ap = _Parser(
        prog="fastdeploy-mtp",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"fastdeploy-mtp {package_version()}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (demo, generate, serve, router, check_drafts):
        command.register(sub)
    return ap


def _debug() -> bool:
    return os.environ.get("FDMTP_DEBUG", "") not in ("", "0")


def _report(exc: BaseException) -> None:
    message = " ".join(str(exc).split()) or type(exc).__name__
    print(f"fastdeploy-mtp: error: {message}", file=sys.stderr)


def _run(argv: list[str] | None, mask: set[int | signal.Signals]) -> int:
    # Paddle warns at import that ccache (a build cache for its JIT extensions) is missing;
    # nothing here builds extensions, so the line is noise in every command's output.
    warnings.filterwarnings("ignore", message="No ccache found")
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    # the command starts: a SIGINT or SIGTERM held back since ``main`` began comes now, in
    # the main thread (the only one that has them unblocked: the threads started since
    # inherited the block); Paddle's import (``import_paddle``) holds them back again
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return int(args.func(args))


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 failure while running, 2 bad argument,
    130 interrupted). Expected errors are printed as one line, ``fastdeploy-mtp: error: ...``;
    set ``FDMTP_DEBUG=1`` to have them raised with their traceback.

    Its first instruction blocks SIGINT and SIGTERM, until the arguments are parsed and the
    command starts. Every thread the imports start (numpy's BLAS pool, a tokenizer's) inherits
    the block, so a Ctrl-C during the imports waits and then reaches the main thread, where
    it is one ``KeyboardInterrupt`` at a known place. Without the block such a thread would
    take the signal, and the ``KeyboardInterrupt`` would strike whatever the main thread ran:
    an import half-way (a traceback), or Paddle's import, which can swallow it (the command
    then ran to its end) or fail with ``ImportError``. The caller's signal mask, and for a
    call with ``argv`` its SIGINT handler, are back when ``main`` returns."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        from ..config import SpeculativeConfigError
        from ..credentials import CredentialError
        from ..engine_args import UsageError
        from ..runtime.request import GenerationError
        from .offline import CommandError

        try:
            return _run(argv, mask)
        except KeyboardInterrupt:
            if _debug():
                raise
            if argv is None:  # the program (console script, ``python -m``), about to exit 130:
                # a Ctrl-C that comes (or came, still pending) now changes nothing. A caller
                # in-process keeps its own handler (its later children would inherit SIG_IGN)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            print("\nfastdeploy-mtp: interrupted", file=sys.stderr)  # (after a progress line's \r)
            return 130
        except (UsageError, SpeculativeConfigError, CredentialError) as exc:
            if _debug():
                raise
            _report(exc)
            return 2
        except (ValueError, OSError, CommandError, GenerationError) as exc:
            if _debug():
                raise
            _report(exc)
            return 1
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


if __name__ == "__main__":
    sys.exit(main())
