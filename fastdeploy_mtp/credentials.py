"""The credentials of a deployment, and the count of what was refused for want of one.

* **API keys** (:mod:`fastdeploy_mtp.tenancy`): clients send one as ``Authorization: Bearer
  <key>`` (OpenAI's header) to every ``/v1/*`` endpoint of ``serve`` and ``router``.
* **Splitwise secret** (:func:`splitwise_secret`): shared by every prefill instance, decode
  instance and router of one splitwise deployment. The router presents it to the instances'
  ``/v1/splitwise/*`` endpoints; the prefill instance signs each hand-over with it and the
  decode instance checks that signature; KV control messages are signed with it. It is read
  from :data:`SECRET_ENV`, else ``--splitwise-secret-file``, else a per-user file
  (:func:`default_secret_path`) created on first use, so that instances of one user on one
  host agree without configuration; across hosts, give every instance the same file.
  A secret is never taken from the command line (other local users can read it there).
* :class:`DroppedMessages` counts, per channel, the messages refused because their sender
  did not prove a credential or because they were not the awaited answer; ``/metrics`` shows
  them as ``fastdeploy:dropped_messages_total{channel=...}``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: Environment variable holding the API key (``--api-key`` wins over it).
API_KEY_ENV = "FASTDEPLOY_MTP_API_KEY"
#: Environment variable holding the splitwise secret itself (wins over any file).
SECRET_ENV = "FASTDEPLOY_MTP_SPLITWISE_SECRET"
#: Fewest bytes a secret may have.
MIN_SECRET_BYTES = 16
_MAX_SECRET_BYTES = 4096

#: The channels :class:`DroppedMessages` counts.
CHANNELS = ("worker", "kv", "http", "handoff")


class CredentialError(ValueError):
    """A credential that cannot be used (names the file or variable and why)."""


def default_secret_path() -> Path:
    """``$XDG_CONFIG_HOME/fastdeploy_mtp/splitwise_secret`` (``~/.config/...`` without it)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "fastdeploy_mtp" / "splitwise_secret"


def privacy_refusal(
    st: os.stat_result, file_type: Callable[[int], bool], refusals: Mapping[str, str]
) -> str | None:
    """``None`` when the file ``st`` describes is this user's alone, else what is wrong, in the
    words of ``refusals[problem]``: ``"type"`` (``file_type(st.st_mode)`` is false, e.g.
    ``stat.S_ISDIR`` of a link), ``"owner"`` (another uid owns it) or ``"mode"`` (a group or
    other permission bit is set), formatted with ``uid`` (the owner's), ``euid`` (this user's)
    and ``mode`` (the permission bits). Take ``st`` from the open descriptor (``os.fstat``) or
    without following a link (``os.lstat``)."""
    if not file_type(st.st_mode):
        problem = "type"
    elif st.st_uid != os.geteuid():
        problem = "owner"
    elif st.st_mode & 0o077:
        problem = "mode"
    else:
        return None
    return refusals[problem].format(uid=st.st_uid, euid=os.geteuid(), mode=stat.S_IMODE(st.st_mode))


#: What :func:`read_secret_file` says of a file that is not this user's alone
#: (:func:`privacy_refusal`'s words).
_SECRET_FILE_REFUSALS = {
    "type": "not a regular file",
    "owner": "owned by uid {uid}, not by this user (uid {euid})",
    "mode": "mode {mode:04o} lets other users read it; `chmod 600` it",
}


def _check_secret(value: bytes, where: str) -> bytes:
    value = value.strip()
    if len(value) < MIN_SECRET_BYTES:
        raise CredentialError(
            f"{where}: a splitwise secret needs at least {MIN_SECRET_BYTES} bytes, got {len(value)}"
        )
    if len(value) > _MAX_SECRET_BYTES:
        raise CredentialError(
            f"{where}: a splitwise secret is too long (more than {_MAX_SECRET_BYTES} bytes)"
        )
    return value


def read_private_file(path: str | os.PathLike[str], where: str, limit: int) -> bytes:
    """The first ``limit + 1`` bytes of ``path``, which must be a regular file owned by this
    user with no group or other permission bit (``chmod 600``; a link is not followed).
    ``where`` names the file in the :class:`CredentialError` that refuses it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise CredentialError(f"{where}: {exc.strerror}") from None
    try:
        refusal = privacy_refusal(os.fstat(fd), stat.S_ISREG, _SECRET_FILE_REFUSALS)
        if refusal is not None:
            raise CredentialError(f"{where}: {refusal}")
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)


def read_secret_file(path: str | os.PathLike[str]) -> bytes:
    """The secret in ``path``: a private file (:func:`read_private_file`), 16..4096 bytes
    (surrounding white space ignored)."""
    where = f"splitwise secret file {os.fspath(path)}"
    return _check_secret(read_private_file(path, where, _MAX_SECRET_BYTES), where)


def _create_default(path: Path) -> None:
    """Write a fresh random secret to ``path`` (mode 0600, created exclusively; a racing
    creator's file is kept)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
    finally:
        os.close(fd)


def splitwise_secret(path: str | None = None) -> bytes:
    """The splitwise secret: :data:`SECRET_ENV`, else the file ``path``
    (``--splitwise-secret-file``), else :func:`default_secret_path` (created with a random
    secret if missing). Raises :class:`CredentialError` naming the source at fault."""
    env = os.environ.get(SECRET_ENV)
    if env:
        return _check_secret(env.encode(), f"environment variable {SECRET_ENV}")
    if path is not None:
        return read_secret_file(path)
    default = default_secret_path()
    if not default.exists():
        _create_default(default)
    return read_secret_file(default)


def matching_key(header: bytes | None, keys: list[bytes]) -> int | None:
    """The index in ``keys`` of the key ``header`` (an ``Authorization`` value, as sent)
    presents as ``Bearer <key>``, or ``None``. Every key is compared, in constant time."""
    if not header or not keys:
        return None
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    given = token.strip()
    found = None
    for i, key in enumerate(keys):
        if hmac.compare_digest(given, key) and found is None:
            found = i
    return found


def derive(secret: bytes, purpose: str) -> bytes:
    """A key for one ``purpose`` (``"http"``, ``"handoff"``, ``"kv"``) from the splitwise secret,
    so that no channel's credential reveals another's."""
    return hmac.new(secret, b"fastdeploy-mtp/" + purpose.encode(), hashlib.sha256).digest()


def http_token(secret: bytes) -> bytes:
    """What the router presents to the instances as ``Authorization: Bearer <token>``."""
    return derive(secret, "http").hex().encode()


def canonical(obj: Any) -> bytes:
    """The bytes a signature covers: ``obj`` as JSON with sorted keys and no spaces."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def sign(key: bytes, obj: Any) -> str:
    """HMAC-SHA256 of :func:`canonical` ``obj`` under ``key``, hex."""
    return hmac.new(key, canonical(obj), hashlib.sha256).hexdigest()


def strings_equal(given: Any, expected: str) -> bool:
    """``given == expected`` in constant time, for a ``given`` that is any str (a peer may
    send characters ``hmac.compare_digest`` refuses to compare as str) or not a str at all
    (then ``False``)."""
    if not isinstance(given, str):
        return False
    encode = lambda text: text.encode("utf-8", "surrogatepass")  # noqa: E731
    return hmac.compare_digest(encode(given), encode(expected))


def signature_matches(key: bytes, obj: Any, signature: Any) -> bool:
    """Whether ``signature`` is :func:`sign` ``(key, obj)`` (constant time; False for a
    non-str signature or an object JSON cannot encode)."""
    try:
        expected = sign(key, obj)
    except (TypeError, ValueError):
        return False
    return strings_equal(signature, expected)


class DroppedMessages:
    """Thread-safe counts of refused messages per channel (:data:`CHANNELS`): ``worker``
    (engine <-> worker socket), ``kv`` (a prefill instance's KV port), ``http`` (a request
    without the credential an endpoint asks for), ``handoff`` (a hand-over whose signature or
    contents do not hold)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(CHANNELS, 0)

    def add(self, channel: str, n: int = 1) -> None:
        if channel not in self._counts:
            raise ValueError(f"unknown channel {channel!r} (expected one of {CHANNELS})")
        with self._lock:
            self._counts[channel] += n

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def add_credential_args(p: argparse.ArgumentParser) -> None:
    """``--splitwise-secret-file`` (``serve`` and ``router``; the client keys are
    :func:`fastdeploy_mtp.tenancy.add_tenancy_args`')."""
    p.add_argument(
        "--splitwise-secret-file",
        default=None,
        metavar="FILE",
        help="splitwise: the secret shared by the router and every instance (a chmod-600 file; "
        "default: $FASTDEPLOY_MTP_SPLITWISE_SECRET, else "
        "~/.config/fastdeploy_mtp/splitwise_secret, created on first use)",
    )
