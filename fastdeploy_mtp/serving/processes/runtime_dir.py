"""The runtime directory of a ``serve`` deployment: a private directory holding the engine's
socket to its workers and a record of who owns the deployment.

Layout: ``<base>/<engine_worker_queue_port>/`` where ``<base>`` is
``$XDG_RUNTIME_DIR/fastdeploy_mtp`` when ``XDG_RUNTIME_DIR`` names a directory of this user,
else ``<tmp>/fastdeploy_mtp-<uid>``. Every level is created with mode 0700 and reused only if
it is a real directory (not a symbolic link) owned by this user with no group or other
permission bit, so no other local user can connect to the socket or plant a file in it.

Files in a deployment's directory:

* ``engine.sock``: the engine's ZMQ ROUTER socket (``ipc://``), which the workers connect to;
* ``owner.json``: ``{"pid", "start", "children"}``: the engine's pid and start time (a
  recycled pid is not mistaken for it) and its children's (``[{"pid", "start"}]``), which the cache
  manager reads to stop the workers and clean up when the engine was killed;
* ``stopping``: created when the engine stops the deployment, so that the cache manager can
  tell that SIGTERM from the one the kernel sends when the engine dies.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from ...credentials import privacy_refusal

SOCKET_NAME = "engine.sock"
OWNER_NAME = "owner.json"
#: created by the engine before it stops its children: their SIGTERM is a shutdown, not its death
STOPPING_NAME = "stopping"


class RuntimeDirError(ValueError):
    """A runtime directory that is not private to this user, or in use by a live deployment."""


def base_dir() -> Path:
    """Where this user's deployments keep their runtime directories (not created here)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        try:
            st = os.stat(xdg)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                return Path(xdg) / "fastdeploy_mtp"
        except OSError:
            pass
    return Path(tempfile.gettempdir()) / f"fastdeploy_mtp-{os.geteuid()}"


#: What :func:`private_dir` says of a directory that is not this user's alone
#: (:func:`~fastdeploy_mtp.credentials.privacy_refusal`'s words).
_DIR_REFUSALS = {
    "type": "is not a directory (a link or a file); remove it",
    "owner": "is owned by uid {uid}, not by this user; remove it",
    "mode": "has mode {mode:o}: other users may use it; `chmod 700` it or remove it",
}


def private_dir(path: Path) -> Path:
    """``path`` as a directory only this user can use: created with mode 0700 if missing;
    an existing one must be a real directory of this user without group or other bits."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    refusal = privacy_refusal(os.lstat(path), stat.S_ISDIR, _DIR_REFUSALS)
    if refusal is not None:
        raise RuntimeDirError(f"runtime directory {path} {refusal}")
    return path


def deployment_dir(port: int) -> Path:
    """The runtime directory of the deployment whose engine-worker port is ``port``."""
    return base_dir() / str(port)


def endpoint(port: int) -> str:
    """The ZMQ address of the engine's worker socket (``ipc://`` in the runtime directory)."""
    return f"ipc://{deployment_dir(port) / SOCKET_NAME}"


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    except (OSError, IndexError, ValueError):
        return None


def read_owner(directory: Path) -> dict[str, object] | None:
    """The owner record of a deployment directory (``None`` if missing or unreadable)."""
    try:
        owner = json.loads((directory / OWNER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def owner_alive(owner: dict[str, object] | None) -> bool:
    """Whether the process an owner record names still runs (the same process, not a recycled
    pid)."""
    if owner is None or not isinstance(owner.get("pid"), int):
        return False
    pid = owner["pid"]
    assert isinstance(pid, int)
    return pid > 0 and process_start(pid) == owner.get("start")


def claim(port: int) -> Path:
    """Make the runtime directory of the deployment on ``port`` this process's: refused
    (:class:`RuntimeDirError`) while another live process owns it; a dead owner's is
    replaced."""
    private_dir(base_dir())
    directory = deployment_dir(port)
    if directory.exists() or directory.is_symlink():
        private_dir(directory)
        owner = read_owner(directory)
        if owner_alive(owner) and owner is not None and owner.get("pid") != os.getpid():
            raise RuntimeDirError(
                f"--engine-worker-queue-port {port}: another deployment (pid {owner['pid']}) uses "
                f"it ({directory}); give each server its own port"
            )
        shutil.rmtree(directory)  # a dead deployment's
    private_dir(directory)
    write_owner(directory, [])
    return directory


def write_owner(directory: Path, children: list[int]) -> None:
    """Record this process as the owner of ``directory``, with its ``children`` (each with
    its start time, so a survivor never signals a recycled pid)."""
    kids = [{"pid": pid, "start": process_start(pid)} for pid in children]
    record = {"pid": os.getpid(), "start": process_start(os.getpid()), "children": kids}
    tmp = directory / (OWNER_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, directory / OWNER_NAME)


def mark_stopping(port: int) -> None:
    """Say that the engine is stopping the deployment on ``port`` (see :data:`STOPPING_NAME`)."""
    directory = deployment_dir(port)
    if directory.is_dir():
        fd = os.open(directory / STOPPING_NAME, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.close(fd)


def remove(port: int) -> None:
    """Remove the runtime directory of the deployment on ``port`` (if it is there)."""
    shutil.rmtree(deployment_dir(port), ignore_errors=True)
