"""``fastdeploy-mtp router``: the options of
:func:`fastdeploy_mtp.serving.router.server.run_router`."""

from __future__ import annotations

import argparse
from typing import Any

from ..credentials import add_credential_args
from ..engine_args import UsageError, options_from_args, positive_float, positive_int
from ..serving.processes.start_up import option_defaults
from ..serving.router.options import RouterOptions

#: each flag's default, from :class:`RouterOptions` (the one place it is written)
_DEFAULTS = option_defaults(RouterOptions)


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
    p.add_argument(
        "--host", default=_DEFAULTS["host"], help="address to listen on (default %(default)s)"
    )
    p.add_argument(
        "--port",
        type=positive_int,
        default=_DEFAULTS["port"],
        help="HTTP port (default %(default)s)",
    )
    p.add_argument(
        "--queue-timeout",
        type=positive_float,
        default=_DEFAULTS["queue_timeout"],
        help="seconds a request may wait for a decode instance with room before it fails with 503 "
        "(default %(default)g)",
    )
    p.add_argument(
        "--instance-timeout",
        type=positive_float,
        default=_DEFAULTS["instance_timeout"],
        help="seconds an instance may stay silent (a prefill answer, or the next event of a "
        "decode stream) before the request fails with 504 naming it (default %(default)g)",
    )
    p.add_argument(
        "--served-model-name",
        default=_DEFAULTS["served_model_name"],
        help="model id in the API (default: the first prefill instance's)",
    )
    p.add_argument(
        "--tokenizer",
        default=_DEFAULTS["tokenizer"],
        metavar="DIR",
        help="the served model's folder (its tokenizer files and generation_config.json; default: "
        "the shipped one)",
    )
    p.add_argument(
        "--start-timeout",
        type=positive_float,
        default=_DEFAULTS["start_timeout"],
        help="seconds to wait at start-up for every instance's /health (default %(default)g)",
    )
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
