"""The HTTP server of ``serve`` and ``router``: the listening socket, bound before anything
slow starts (:func:`bind_listener`), and uvicorn serving an app on it until SIGINT/SIGTERM
(:func:`run_http`), which prints the "ready" line.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from ..processes.start_up import Progress


def run_http(
    app: FastAPI,
    host: str,
    port: int,
    progress: Progress,
    t0: float,
    on_server: Callable[[Any], None] | None = None,
    sock: socket.socket | None = None,
) -> int:
    """Serve ``app`` with uvicorn on ``host:port`` until SIGINT/SIGTERM; returns the exit
    status: 130 after SIGINT (Ctrl-C), 0 after SIGTERM or a stop from ``on_server``'s server,
    1 if it did not start (e.g. the port was taken: uvicorn said why). ``on_server`` gets the
    ``uvicorn.Server`` first (to stop it from another thread). uvicorn handles the signals
    while it runs and raises them again once it has stopped; the handlers installed here take
    that second delivery (the caller restores its own afterwards), so the caller's clean-up
    runs. ``sock``: a socket :func:`bind_listener` bound already (uvicorn then binds none).
    uvicorn logs at ``progress.log_level``, its info lines only at ``debug``. A second signal
    while it stops does not force it (the graceful shutdown is bounded by 5 s anyway): forcing
    cancels the app's lifespan mid-shutdown, which uvicorn reports with a traceback."""
    import signal

    import uvicorn

    class _OneStop(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level={"debug": "debug", "error": "error"}.get(progress.log_level, "warning"),
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = _OneStop(config)
    if on_server is not None:
        on_server(server)
    progress(f"ready in {time.perf_counter() - t0:.1f} s: listening on http://{host}:{port}")
    received: list[int] = []

    def requested_stop(signum: int, frame: object) -> None:
        received.append(signum)
        if len(received) > 1:  # a second Ctrl-C during the clean-up: it is under way already
            return
        what = "interrupted" if signum == signal.SIGINT else "SIGTERM received"
        progress.warning(f"{what}: shutting down")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, requested_stop)
    server.run(sockets=[sock] if sock is not None else None)
    if not server.started:
        return 1
    return 130 if signal.SIGINT in received else 0


def bind_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, bound before anything slow starts, so a taken
    port is refused at once. Raises ``UsageError`` naming ``--port`` or ``--host``."""
    from ...engine_args import UsageError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UsageError(f"--port {port}: cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock
