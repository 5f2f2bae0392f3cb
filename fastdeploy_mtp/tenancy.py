"""Who a deployment's clients are and what they share: the API keys (one per tenant), the
key that opens ``/metrics``, and each request's prefix-cache namespace.

* **API keys.** ``--api-key KEY`` (or :data:`~fastdeploy_mtp.credentials.API_KEY_ENV`) and
  ``--api-key-file FILE`` (one key per line; blank lines and ``#`` comments ignored; a
  private file, as the splitwise secret's) together give the keys ``/v1/*`` accepts. Each
  key is one tenant. A key is visible ASCII (``!`` to ``~``): what HTTP clients send as a
  header value byte for byte, so that a key the server accepts is one a client can present.
* **Prefix-cache namespaces.** A request's KV blocks are shared only with requests of the
  same namespace (:func:`fastdeploy_mtp.runtime.block_pool.block_keys` chains its keys from
  it). The namespace is :func:`cache_namespace` of the tenant (with
  ``--prefix-cache-scope per-key``, the default: the key the request presented) and the
  request's ``cache_salt`` (vLLM's field). Without keys or salt it is the empty, global
  namespace. Otherwise a client could learn whether another client sent a prompt: a hit
  shows in the time to the first token and in ``/metrics``' prefix-cache counters.
* **Metrics.** ``--metrics-api-key KEY`` (or :data:`METRICS_KEY_ENV`) puts ``/metrics``
  behind its own key (a monitoring system's; no tenant key opens it). Without it
  ``/metrics`` is open, as Prometheus scrapers expect.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from dataclasses import dataclass

from .credentials import API_KEY_ENV, CredentialError, read_private_file

#: Environment variable holding the ``/metrics`` key (``--metrics-api-key`` wins over it).
METRICS_KEY_ENV = "FASTDEPLOY_MTP_METRICS_API_KEY"
#: ``--prefix-cache-scope`` values: one namespace per API key, or one for everyone.
SCOPES = ("per-key", "global")
#: Most characters of a ``cache_salt``.
MAX_SALT_CHARS = 1024
#: Most bytes of an ``--api-key-file``.
_MAX_KEY_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class ClientKeys:
    """The client-facing credentials of ``serve`` or ``router``.

    Attributes:
        api_keys: what ``/v1/*`` accepts as ``Authorization: Bearer <key>``, one per tenant
            (empty: those endpoints are open).
        metrics_key: what ``/metrics`` asks for (``None``: open).
        scope: ``"per-key"`` (each key's requests share prefix-cache blocks only among
            themselves) or ``"global"`` (every request may share with every other).
    """

    api_keys: tuple[str, ...] = ()
    metrics_key: str | None = None
    scope: str = "per-key"

    def tenant(self, index: int | None) -> bytes | None:
        """The tenant of a request that presented ``api_keys[index]`` (``None``: no key, or
        the global scope): a digest of the key, never the key itself."""
        if index is None or self.scope == "global":
            return None
        return hashlib.sha256(b"fastdeploy_mtp tenant\0" + self.api_keys[index].encode()).digest()


def check_key(key: str, where: str) -> str:
    """``key`` without surrounding white space, refused (naming ``where``) unless it is a
    non-empty string of visible ASCII characters."""
    key = key.strip()
    if not key:
        raise CredentialError(f"{where}: the key is empty")
    bad = next((c for c in key if not "!" <= c <= "~"), None)
    if bad is not None:
        raise CredentialError(
            f"{where}: the key holds {bad!r}; a key must be visible ASCII characters (! to ~), "
            "which is what HTTP clients send in the Authorization header"
        )
    return key


def read_key_file(path: str) -> list[str]:
    """The keys in ``path``: one per line, blank lines and lines starting with ``#`` ignored;
    a private file (owned by this user, ``chmod 600``), at least one key, none twice."""
    where = f"--api-key-file {path}"
    data = read_private_file(path, where, _MAX_KEY_FILE_BYTES)
    if len(data) > _MAX_KEY_FILE_BYTES:
        raise CredentialError(f"{where}: larger than {_MAX_KEY_FILE_BYTES} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise CredentialError(f"{where}: byte {exc.start} is not ASCII") from None
    keys: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            key = check_key(line, f"{where}, line {number}")
            if key in keys:
                raise CredentialError(f"{where}, line {number}: the same key as an earlier line")
            keys.append(key)
    if not keys:
        raise CredentialError(f"{where}: no key in the file")
    return keys


def client_keys(
    api_key: str | None,
    api_key_file: str | None = None,
    metrics_api_key: str | None = None,
    scope: str = "per-key",
) -> ClientKeys:
    """The :class:`ClientKeys` of the options (each ``None`` when not given): ``api_key``
    (else :data:`~fastdeploy_mtp.credentials.API_KEY_ENV`) with the keys of
    ``api_key_file``; ``metrics_api_key`` (else :data:`METRICS_KEY_ENV`); ``scope``.
    Raises :class:`CredentialError` naming the option or file at fault."""
    if scope not in SCOPES:
        raise CredentialError(f"--prefix-cache-scope: {scope!r} is not one of {SCOPES}")
    keys: list[str] = []
    single = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if single is not None:
        source = "--api-key" if api_key is not None else f"environment variable {API_KEY_ENV}"
        keys.append(check_key(single, source))
    for key in read_key_file(api_key_file) if api_key_file is not None else []:
        if key in keys:
            raise CredentialError(f"--api-key-file {api_key_file}: holds the --api-key key too")
        keys.append(key)
    metrics = metrics_api_key if metrics_api_key is not None else os.environ.get(METRICS_KEY_ENV)
    if metrics is not None:
        metrics = check_key(metrics, "--metrics-api-key")
        if metrics in keys:
            raise CredentialError(
                "--metrics-api-key: the same key as a client's; give the metrics scraper a key "
                "of its own"
            )
    return ClientKeys(tuple(keys), metrics, scope)


@dataclass(kw_only=True)
class AccessOptions:
    """The credentials options ``serve`` and ``router`` share (their options dataclasses
    derive from this one): who may call them and which requests share prefix-cache blocks."""

    #: ``--api-key`` (or ``FASTDEPLOY_MTP_API_KEY``) and ``--api-key-file``: the keys clients
    #: present as ``Authorization: Bearer`` on ``/v1/*``, one per tenant
    api_key: str | None = None
    api_key_file: str | None = None
    #: ``--metrics-api-key`` (or ``FASTDEPLOY_MTP_METRICS_API_KEY``): the key of ``/metrics``
    metrics_api_key: str | None = None
    #: ``--prefix-cache-scope``: ``"per-key"`` or ``"global"``
    prefix_cache_scope: str = "per-key"
    #: ``--splitwise-secret-file``: the splitwise secret's file (see
    #: :mod:`fastdeploy_mtp.credentials`)
    splitwise_secret_file: str | None = None


def options_keys(opts: AccessOptions) -> ClientKeys:
    """:func:`client_keys` of a server's options."""
    return client_keys(
        opts.api_key, opts.api_key_file, opts.metrics_api_key, opts.prefix_cache_scope
    )


def check_salt(salt: object) -> str | None:
    """The problem with a request's ``cache_salt`` (``None``: fine). A salt is a non-empty
    string of at most :data:`MAX_SALT_CHARS` characters, or absent."""
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        return "cache_salt must be a non-empty string"
    if len(salt) > MAX_SALT_CHARS:
        return f"cache_salt is longer than {MAX_SALT_CHARS} characters"
    return None


def cache_namespace(tenant: bytes | None, salt: str | None) -> bytes:
    """The prefix-cache namespace (32 bytes; ``b""``, the global one, when both are ``None``)
    of a request from ``tenant`` (:meth:`ClientKeys.tenant`) with ``cache_salt`` ``salt``.
    Each part is length-prefixed, so no tenant and salt run into another pair's."""
    if tenant is None and salt is None:
        return b""
    h = hashlib.sha256(b"fastdeploy_mtp cache namespace v1")
    for part in (tenant, None if salt is None else salt.encode("utf-8", "surrogatepass")):
        if part is None:
            h.update(b"\xff" * 8)  # absent, unlike any length
        else:
            h.update(len(part).to_bytes(8, "little") + part)
    return h.digest()


def add_tenancy_args(p: argparse.ArgumentParser) -> None:
    """``--api-key``, ``--api-key-file``, ``--metrics-api-key`` and ``--prefix-cache-scope``
    (``serve`` and ``router``)."""
    p.add_argument(
        "--api-key",
        default=None,
        help="clients must send `Authorization: Bearer KEY` on /v1/* (default: "
        f"${API_KEY_ENV}, else none; the command line is visible to other local users, the "
        "variable is not)",
    )
    p.add_argument(
        "--api-key-file",
        default=None,
        metavar="FILE",
        help="more client keys, one per line (# comments), each a tenant: a chmod-600 file",
    )
    p.add_argument(
        "--metrics-api-key",
        default=None,
        metavar="KEY",
        help=f"/metrics asks for this key (default: ${METRICS_KEY_ENV}, else /metrics is open)",
    )
    p.add_argument(
        "--prefix-cache-scope",
        choices=SCOPES,
        default="per-key",
        help="per-key (default): requests share prefix-cache blocks only with requests that "
        "presented the same API key (and cache_salt); global: with every request of the same "
        "cache_salt",
    )
