"""Start and stop a real ``fastdeploy-mtp serve`` on a loopback port, for tests and scripts.

:class:`ServerProcess` runs the CLI in a child process (its own session, so a test can signal
the whole tree), waits for ``/health``, and on :meth:`ServerProcess.stop` sends SIGTERM and
checks the shutdown contract: exit status, no child process left, no shared-memory name
and no SysV message queue left behind. :func:`remote_runner` holds the serving engine's
worker processes without the HTTP server, under the same clean-up check.

For splitwise tests: :func:`splitwise_instance` / :func:`splitwise_instances` start prefill
and decode instances, :func:`splitwise_router` a router over them in this process
(:class:`ThreadServer`), :func:`splitwise_post` talks to an instance as the router does.
:func:`offline` is the offline engine's output every served output is compared with.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI

from fastdeploy_mtp.distributed import find_free_port_range
from fastdeploy_mtp.serving.messages.wire import version_headers

_T = TypeVar("_T")
#: the test servers' ``--max-num-seqs`` unless a test gives one: serve's default (up to 256
#: slots, from the KV memory) costs every step and start-up a little on this CPU, which the
#: suite would pay in every server; tests of many slots say so
TEST_SLOTS = 8


def shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def own_names(names: set[str], queue_port: int, device_ids: list[int]) -> list[str]:
    """Of ``names``, those one serving deployment makes: its cache-ready signal (suffixed by
    its engine-worker port) and the KV caches of its device ids. Other deployments may run
    on this host at the same time; their names are not this one's leftovers."""

    def owned(name: str) -> bool:
        m = re.search(r"\.device(\d+)$", name)
        return name.endswith(f".{queue_port}") or (m is not None and int(m.group(1)) in device_ids)

    return sorted(n for n in names if owned(n))


def http_get(
    url: str, timeout: float = 30, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """(status, body text) of a GET (with ``headers``, e.g. an ``Authorization``); an HTTP
    error status is returned, not raised."""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers or {}), timeout=timeout
        ) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def http_post(
    url: str, body: dict[str, Any], timeout: float = 60, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """(status, answer) of a JSON POST: the parsed JSON, or for an event stream the list of
    its ``data: {...}`` events; an HTTP error status is returned, not raised."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            if r.headers.get("content-type", "").startswith("text/event-stream"):
                return r.status, [
                    json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")
                ]
            return r.status, json.loads(raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def scrape_metrics(
    base_url: str, timeout: float = 30, headers: dict[str, str] | None = None
) -> dict[str, float]:
    """The ``fastdeploy:*`` samples of ``base_url/metrics`` (fetched with ``headers``, e.g. the
    metrics key's ``Authorization``), labelled ones under ``name{label="value"}`` and, summed
    over their labels, under ``name`` (for a family without an unlabelled sample)."""
    status, text = http_get(base_url + "/metrics", timeout, headers)
    assert status == 200, (status, text)
    samples = {
        m[1]: float(m[2])
        for m in re.finditer(r"^(fastdeploy:[a-z0-9_]+(?:\{[^}]*\})?) (\S+)$", text, re.M)
    }
    sums: dict[str, float] = {}
    for key, value in samples.items():
        if "{" in key:
            bare = key.split("{", 1)[0]
            sums[bare] = sums.get(bare, 0.0) + value
    return {**sums, **samples}


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class ServerProcess:
    """``fastdeploy-mtp serve <args>`` on 127.0.0.1:<free port>.

    Args:
        args: extra CLI arguments (speculation, --tensor-parallel-size, ...).
        start_timeout: seconds to wait for ``/health``.
        env: the server's environment (default: this process's).
        slots: ``--max-num-seqs`` when ``args`` has none (:data:`TEST_SLOTS`; ``None``: serve's
            own default, from the KV memory).
        cli: the command that runs ``fastdeploy-mtp`` (default: this interpreter with ``-m``;
            the installed console script runs it as a user's shell does).
        cwd: the server's working directory (default: this process's).
    """

    def __init__(
        self,
        args: list[str],
        start_timeout: float = 180.0,
        env: dict[str, str] | None = None,
        on: tuple[Any, str] | None = None,
        slots: int | None = TEST_SLOTS,
        cli: list[str] | None = None,
        cwd: str | None = None,
    ):
        if slots is not None and "--max-num-seqs" not in args:
            args = [*args, "--max-num-seqs", str(slots)]
        #: ``(hosts, name)``: run on host ``name`` of a :class:`~tests.support.netns.Hosts`
        #: (its own network and ``/dev/shm``), reached at its address from that host's side
        self.on = on
        self.host = "127.0.0.1" if on is None else on[0].addresses[on[1]]
        self.port = find_free_port_range(
            2
        )  # two distinct ports: HTTP, then the engine-worker socket
        self.queue_port = self.port + 1
        if "--device-ids" not in args:  # names of its own: other servers on this host use 0..tp-1
            args = [*args, "--device-ids", device_ids(_tp_of(args))]
        self.device_ids = [int(d) for d in args[args.index("--device-ids") + 1].split(",")]
        self.log = tempfile.NamedTemporaryFile(
            "w+", prefix="fdmtp-serve-", suffix=".log", delete=False
        )
        self.shm_before = shm_names()
        cmd = [
            *(cli or [sys.executable, "-m", "fastdeploy_mtp.entrypoints.cli"]),
            "serve",
            "--port",
            str(self.port),
            "--engine-worker-queue-port",
            str(self.queue_port),
            *args,
        ]
        if on is not None:
            if "--host" not in args:
                cmd += ["--host", self.host]
            cmd = on[0].command(on[1], cmd, private_shm=True)
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )
        self.children: list[int] = []
        #: ``os.stat`` of the /dev/shm the server keys its SysV queue on, when it is not ours (a
        #: server on a host of its own has a private /dev/shm, so another key for the same id)
        self.shm_stat: os.stat_result | None = None
        try:
            self._wait_healthy(start_timeout)
        except BaseException:
            self.kill()
            raise

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def reach(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``fn(*args, **kwargs)`` from where this server can be reached: here, or for a
        server on a host of its own, from inside that host."""
        if self.on is None:
            return fn(*args, **kwargs)
        return self.on[0].call(self.on[1], fn, *args, **kwargs)

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"serve exited with {self.proc.returncode} during start-up:\n{self.output()}"
                )
            if self.on is not None and self.shm_stat is None:
                self.shm_stat = private_shm_stat(self.proc.pid)
            try:
                if self.reach(http_get, self.base_url + "/health", 2)[0] == 200:
                    self.children = descendants(self.proc.pid)
                    if self.on is not None and self.shm_stat is None:
                        self.shm_stat = private_shm_stat(self.proc.pid)
                        assert self.shm_stat is not None, (
                            "a server on a host of its own has no /dev/shm of its own"
                        )
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"serve did not become healthy within {timeout} s:\n{self.output()}")

    def worker_pids(self) -> list[int]:
        """Pids of the worker processes
        (``python -m fastdeploy_mtp.serving.processes.worker_process``)."""
        pids = []
        for pid in descendants(self.proc.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"fastdeploy_mtp.serving.processes.worker_process" in f.read():
                        pids.append(pid)
            except OSError:
                continue
        return sorted(pids)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, wait; returns the exit status (kills everything on timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """Last resort (a test failed): kill the whole session, then remove what it owned
        (its queue, runtime directory and /dev/shm names), so a failure leaves nothing."""
        from fastdeploy_mtp.ipc.kv_caches import CACHE_READY_SIGNAL
        from fastdeploy_mtp.serving.token_channel.shared_memory import SHM_PREFIX

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        for pid in self.children:  # a child outside the session (none expected)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        mine = own_names(shm_names() - self.shm_before, self.queue_port, self.device_ids)
        for name in mine:
            if name.startswith(
                (CACHE_READY_SIGNAL, SHM_PREFIX, "key_caches", "value_caches", "latent_caches")
            ):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join("/dev/shm", name))
        self.leftovers()  # removes the queue and the runtime directory

    def leftovers_now(self) -> dict[str, object]:
        """What of the server is still there: live children, its /dev/shm names, its SysV
        queue, its runtime directory (only what this server owns; others may run beside it)."""
        from fastdeploy_mtp.serving.processes import runtime_dir

        return {
            "children": [p for p in self.children if alive(p)],
            "shm": own_names(shm_names() - self.shm_before, self.queue_port, self.device_ids),
            "queue": bool(queues_with_id(self.queue_port)),
            "runtime_dir": runtime_dir.deployment_dir(self.queue_port).exists(),
        }

    def leftovers(self) -> dict[str, object]:
        """:meth:`leftovers_now`, then the queue and the runtime directory removed (so that a
        failed check does not leave them to the next test)."""
        from fastdeploy_mtp.ops import messaging
        from fastdeploy_mtp.serving.processes import runtime_dir

        left = self.leftovers_now()
        with contextlib.suppress(OSError):
            messaging.remove_msg_queue(self.queue_port, self.shm_stat)
        runtime_dir.remove(self.queue_port)
        return left

    def close_log(self) -> None:
        self.log.close()
        os.unlink(self.log.name)


def queues_with_id(msg_queue_id: int) -> list[int]:
    """Keys of the SysV queues (any mount namespace's: ``/proc/sysvipc/msg``) whose key is
    for queue id ``msg_queue_id`` (its low 20 bits, whatever /dev/shm it was keyed on)."""
    with open("/proc/sysvipc/msg") as f:
        keys = [int(line.split()[0]) for line in f.readlines()[1:] if line.strip()]
    return [k for k in keys if k & 0xFFFFF == msg_queue_id]


def private_shm_stat(pid: int) -> os.stat_result | None:
    """``os.stat`` of process ``pid``'s /dev/shm once it is a mount of its own (seen through
    ``/proc/<pid>/root``), ``None`` before that (or if the process is gone)."""
    try:
        st = os.stat(f"/proc/{pid}/root/dev/shm")
    except OSError:
        return None
    return st if st.st_dev != os.stat("/dev/shm").st_dev else None


def stopped_cleanly(server: ServerProcess) -> None:
    code = server.stop()
    left = server.leftovers()
    assert code == 0, f"serve exited {code} on SIGTERM:\n{server.output()}"
    assert left == {"children": [], "shm": [], "queue": False, "runtime_dir": False}, (
        f"left behind {left}:\n{server.output()}"
    )
    server.close_log()


def serving(args: list[str], **kwargs: Any) -> Iterator[ServerProcess]:
    """A module fixture's body: ``ServerProcess(args, **kwargs)``, killed if the tests raised
    through it, else stopped with SIGTERM and checked (:func:`stopped_cleanly`)."""
    srv = ServerProcess(args, **kwargs)
    try:
        yield srv
    except BaseException:
        srv.kill()
        raise
    stopped_cleanly(srv)


@contextlib.contextmanager
def remote_runner(spec_json: str, max_num_seqs: int, max_model_len: int = 256) -> Iterator[Any]:
    """The serving engine's
    :class:`~fastdeploy_mtp.serving.processes.remote_runner.RemoteRunner` (a cache manager
    and one worker process on the shipped checkpoint) in this process, for tests that
    look at what a served step returns. On exit it is closed and must leave no child process,
    no new ``/dev/shm`` name and no SysV queue behind."""
    from fastdeploy_mtp.engine_args import default_model
    from fastdeploy_mtp.ops import messaging
    from fastdeploy_mtp.serving.processes import runtime_dir
    from fastdeploy_mtp.serving.processes.layout import ServeLayout
    from fastdeploy_mtp.serving.processes.remote_runner import RemoteRunner

    before = shm_names()
    layout = ServeLayout(
        model=default_model(),
        speculative_config=spec_json,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        tensor_parallel_size=1,
        engine_worker_queue_port=find_free_port_range(1),
        device_ids=[int(device_ids(1))],
    )
    runner = RemoteRunner(layout, step_timeout=120.0, start_timeout=180.0)
    children = [p.pid for p in runner.procs.values()]
    try:
        yield runner
    finally:
        runner.close()
    left = {
        "children": [p for p in children if alive(p)],
        "shm": own_names(shm_names() - before, layout.engine_worker_queue_port, layout.device_ids),
        "queue": messaging.remove_msg_queue(layout.msg_queue_id),
        "runtime_dir": runtime_dir.deployment_dir(layout.engine_worker_queue_port).exists(),
    }
    assert left == {"children": [], "shm": [], "queue": False, "runtime_dir": False}, (
        f"the remote runner left behind {left}"
    )


def router_headers(secret: bytes | None = None) -> dict[str, str]:
    """What the router sends an instance: the protocol version and its credential (the token
    of ``secret``; default: the test run's splitwise secret)."""
    from fastdeploy_mtp.credentials import SECRET_ENV, http_token

    token = http_token(secret if secret is not None else os.environ[SECRET_ENV].encode())
    return {**version_headers(), "Authorization": "Bearer " + token.decode()}


def splitwise_post(
    url: str, body: dict[str, Any], timeout: float = 60, secret: bytes | None = None
) -> tuple[int, Any]:
    """:func:`http_post` to a ``/v1/splitwise/*`` endpoint, as the router sends it."""
    return http_post(url, body, timeout, router_headers(secret))


class ThreadServer:
    """``app`` served by uvicorn on 127.0.0.1:``port`` in a daemon thread."""

    def __init__(self, app: FastAPI, port: int):
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn:{port}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, (
                f"{self.url} did not start"
            )
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        assert not self.thread.is_alive(), f"{self.url} did not stop"


def offline(prompts: list[str], spec: str, max_tokens: int = 24) -> list[str]:
    """The offline engine's greedy texts (the reference every server output must equal)."""
    from fastdeploy_mtp.config import SpeculativeConfig
    from fastdeploy_mtp.entrypoints.offline import run_prompts

    texts, _, _ = run_prompts(prompts, max_tokens, SpeculativeConfig.from_json(spec), 8, "offline")
    return texts


#: this process's device ids: a block of 1000 of its own (a test run starts a few hundred
#: servers), keyed on the pid so that the workers of a parallel run (``pytest -n``), whose
#: pids are often consecutive, and other test runs on this host never share one
_next_device = [1000 + (os.getpid() % 4000) * 1000]


def _tp_of(args: list[str]) -> int:
    for flag in ("--tensor-parallel-size", "-tp"):
        if flag in args:
            return int(args[args.index(flag) + 1])
    return 1


def device_ids(n: int) -> str:
    """``n`` device ids no other instance on this host uses (they name the KV caches)."""
    first = _next_device[0] + 1
    _next_device[0] += n
    return ",".join(str(first + i) for i in range(n))


def splitwise_instance(role: str, spec: str, *extra: str) -> ServerProcess:
    """``serve --splitwise-role role`` with speculation ``spec`` on device ids of its own."""
    tp = (
        int(extra[extra.index("--tensor-parallel-size") + 1])
        if "--tensor-parallel-size" in extra
        else 1
    )
    return ServerProcess(
        [
            "--speculative-config",
            spec,
            "--splitwise-role",
            role,
            "--device-ids",
            device_ids(tp),
            *extra,
        ]
    )


@contextlib.contextmanager
def splitwise_instances(*specs: tuple[Any, ...]) -> Iterator[list[ServerProcess]]:
    """Start ``splitwise_instance(*spec)`` for each spec; stop them in reverse order, cleanly
    (so that each one's check "no ``/dev/shm`` name left" is not confused by a later one)."""
    started: list[ServerProcess] = []
    try:
        for spec in specs:
            started.append(splitwise_instance(*spec))
        yield started
    except BaseException:
        stop_all(started)
        raise
    try:
        while started:
            stopped_cleanly(started[-1])
            started.pop()
    finally:  # one did not stop cleanly: still stop the others
        stop_all(started)


def stop_all(servers: list[ServerProcess]) -> None:
    """SIGTERM each (so it removes its names), in reverse order; SIGKILL what hangs."""
    for srv in reversed(servers):
        with contextlib.suppress(Exception):
            srv.stop(30)


def router_command(port: int, *args: str) -> list[str]:
    """The argv of ``fastdeploy-mtp router --port PORT ARGS`` run by this interpreter."""
    cli = [sys.executable, "-m", "fastdeploy_mtp.entrypoints.cli"]
    return [*cli, "router", "--port", str(port), *args]


@contextlib.contextmanager
def splitwise_router(
    prefill: ServerProcess,
    decode: ServerProcess,
    queue_timeout: float = 60.0,
    tokenizer: Any = None,
    api_key: str | None = None,
    instance_timeout: float = 60.0,
    secret: bytes | None = None,
) -> Iterator[str]:
    """A router over one prefill and one decode instance, in this process (with the served
    model's ``tokenizer``; default the shipped one's); yields its URL. ``api_key``: what its
    clients must present (``None``: open); ``secret``: the splitwise secret it derives its
    credential from (default: the test run's)."""
    from fastdeploy_mtp.credentials import splitwise_secret
    from fastdeploy_mtp.serving.openai.http_auth import Access
    from fastdeploy_mtp.serving.router.forwarding import Instances
    from fastdeploy_mtp.serving.router.routing import RouterBackend
    from fastdeploy_mtp.serving.router.server import router_app
    from fastdeploy_mtp.tenancy import ClientKeys

    backend = RouterBackend(
        Instances(
            [prefill.base_url],
            [decode.base_url],
            queue_timeout,
            secret=splitwise_secret() if secret is None else secret,
            instance_timeout=instance_timeout,
        )
    )
    access = Access(ClientKeys(() if api_key is None else (api_key,)), None, backend.dropped)
    app = router_app(backend, "fastdeploy-mtp-tiny", tokenizer, access=access)
    srv = ThreadServer(app, find_free_port_range(1))
    try:
        yield srv.url
    finally:
        srv.stop()
