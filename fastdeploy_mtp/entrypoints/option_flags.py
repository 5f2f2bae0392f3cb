"""Command-line flags of an options dataclass (``ServeOptions``, ``RouterOptions``): each flag
defaults to the field it names, so a default is written once (in the dataclass), and the flags
both servers take (where they listen, what they print) are written once for ``serve`` and
``router``."""

from __future__ import annotations

from typing import Any

from ..engine_args import port_number
from ..serving.processes.start_up import LOG_LEVELS, option_defaults


class OptionFlags:
    """Adds flags to a parser (or an argument group), each with the default of the field of
    ``options`` it names (``--max-model-len``: ``max_model_len``)."""

    def __init__(self, options: type) -> None:
        #: each field's default, by name
        self.defaults = option_defaults(options)

    def add(self, parser: Any, flag: str, *aliases: str, **kwargs: Any) -> None:
        """``parser.add_argument(flag, *aliases, **kwargs)`` with the field's default."""
        dest = flag.removeprefix("--").replace("-", "_")
        parser.add_argument(flag, *aliases, default=self.defaults[dest], **kwargs)

    def add_listen_args(self, parser: Any) -> None:
        """``--host`` and ``--port``: where the server listens."""
        self.add(parser, "--host", help="address to listen on (default %(default)s)")
        self.add(
            parser, "--port", type=port_number, help="HTTP port, 1..65535 (default %(default)s)"
        )

    def add_log_level_arg(self, parser: Any) -> None:
        """``--log-level``: what the server prints."""
        self.add(
            parser,
            "--log-level",
            choices=LOG_LEVELS,
            help="info (default): one line per start-up stage, the ready line and one line when "
            "stopping; debug adds how the processes stop and the libraries' own logs (Paddle's "
            "glog lines and FLAGS banners, Mooncake's, uvicorn's); warning: only the Ctrl-C line "
            "and errors; error: only errors",
        )
