"""``fastdeploy-mtp router``: the options of
:func:`fastdeploy_mtp.serving.router.server.run_router`."""

from __future__ import annotations

import argparse
from typing import Any

from ..credentials import add_credential_args
from ..engine_args import UsageError, options_from_args, positive_float
from ..serving.router.options import RouterOptions
from ..tenancy import add_tenancy_args
from .option_flags import OptionFlags

#: the flags of :class:`RouterOptions`, each with its field's default
_FLAGS = OptionFlags(RouterOptions)


def register(sub: Any) -> None:
    """Add the ``router`` subcommand to ``sub`` (an ``add_subparsers`` result)."""
    rtr = sub.add_parser(
        "router",
        help="splitwise router: each request to a prefill instance, then a decode instance "
        "(OpenAI API)",
    )
    add_router_args(rtr)
    rtr.set_defaults(func=cmd_router)


def add_router_args(p: argparse.ArgumentParser) -> None:
    """The router's arguments (it runs no engine: none of the engine options)."""
    p.add_argument(
        "--prefill",
        action="append",
        required=True,
        metavar="URL",
        help="a prefill instance's base URL (repeatable)",
    )
    p.add_argument(
        "--decode",
        action="append",
        required=True,
        metavar="URL",
        help="a decode instance's base URL (repeatable)",
    )
    _FLAGS.add_listen_args(p)
    _FLAGS.add_log_level_arg(p)
    _FLAGS.add(
        p,
        "--queue-timeout",
        type=positive_float,
        help="seconds a request may wait for a decode instance with room before it fails with 503 "
        "(default %(default)g)",
    )
    _FLAGS.add(
        p,
        "--instance-timeout",
        type=positive_float,
        help="seconds an instance may stay silent (a prefill answer, or the next event of a "
        "decode stream) before the request fails with 504 naming it (default %(default)g)",
    )
    _FLAGS.add(
        p, "--served-model-name", help="model id in the API (default: the first prefill instance's)"
    )
    _FLAGS.add(
        p,
        "--tokenizer",
        metavar="DIR",
        help="the served model's folder (its tokenizer files and generation_config.json; default: "
        "the shipped one)",
    )
    _FLAGS.add(
        p,
        "--start-timeout",
        type=positive_float,
        help="seconds to wait at start-up for every instance's /health (default %(default)g)",
    )
    add_tenancy_args(p)
    add_credential_args(p)


def cmd_router(args: argparse.Namespace) -> int:
    """``fastdeploy-mtp router``: see :mod:`fastdeploy_mtp.serving.router.server`."""
    from ..serving.router.forwarding import check_instance_url
    from ..serving.router.server import run_router

    urls: dict[str, list[str]] = {}
    for role in ("prefill", "decode"):
        try:
            urls[role] = [check_instance_url(u, f"--{role}") for u in getattr(args, role)]
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    opts = options_from_args(RouterOptions, args, prefill=urls["prefill"], decode=urls["decode"])
    return run_router(opts)
