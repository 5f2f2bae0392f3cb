"""``fastdeploy-mtp router``: the options of :func:`fastdeploy_mtp.serving.router_server.run_router`."""

from __future__ import annotations

import argparse
from typing import Any

from ..credentials import add_credential_args
from ..engine_args import UsageError, options_from_args, positive_float, positive_int


def register(sub: Any) -> None:
    """Add the ``router`` subcommand to ``sub`` (an ``add_subparsers`` result)."""
    rtr = sub.add_parser(
        "router",
        help="splitwise router: each request to a prefill instance, then a decode instance (OpenAI API)",
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
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=positive_int, default=8000, help="HTTP port (default 8000)")
    p.add_argument(
        "--queue-timeout",
        type=positive_float,
        default=600.0,
        help="seconds a request may wait for a decode instance with room before it fails with 503 (default 600)",
    )
    p.add_argument(
        "--instance-timeout",
        type=positive_float,
        default=60.0,
        help="seconds an instance may stay silent (a prefill answer, or the next event of a decode stream) before "
        "the request fails with 504 naming it (default 60)",
    )
    p.add_argument(
        "--served-model-name",
        default=None,
        help="model id in the API (default: the first prefill instance's)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="the served model's folder (its tokenizer files and generation_config.json; default: the shipped one)",
    )
    p.add_argument(
        "--start-timeout",
        type=positive_float,
        default=300.0,
        help="seconds to wait at start-up for every instance's /health (default 300)",
    )
    add_credential_args(p)


def cmd_router(args: argparse.Namespace) -> int:
    """``fastdeploy-mtp router``: see :mod:`fastdeploy_mtp.serving.router_server`."""
    from ..serving.router_backend import check_instance_url
    from ..serving.router_server import RouterOptions, run_router

    urls: dict[str, list[str]] = {}
    for role in ("prefill", "decode"):
        try:
            urls[role] = [check_instance_url(u, f"--{role}") for u in getattr(args, role)]
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    opts = options_from_args(RouterOptions, args, prefill=urls["prefill"], decode=urls["decode"])
    return run_router(opts)
