"""What every message between the processes of a deployment shares: the protocol version
(:data:`PROTOCOL_VERSION`), how a receiver refuses what it cannot read
(:class:`MessageError`), and the pydantic base classes.

JSON is the encoding, never pickle: the engine's worker socket is a loopback TCP port another
local process could reach, and the splitwise endpoints are HTTP. A message is validated
once, where it is received (:func:`decode_engine_message`, :func:`decode_worker_message`,
:func:`decode_http`): the bytes become one of these objects or a :class:`MessageError`
naming what is wrong; the code after that reads attributes.

The classes are pydantic v2 models: validation runs in pydantic-core (compiled), straight
from the JSON bytes (``validate_json``, no ``json.loads`` first), so the per-step messages
(a few lists of ``N`` or ``N*K`` ints) cost some microseconds against a step of
milliseconds; msgspec would be faster still but is not a dependency, and dataclasses
through a ``TypeAdapter`` validate at the same speed with no gain. ``SamplingParams`` and
``TokenLogprob`` (stdlib dataclasses) are validated field by field as they are.

The messages themselves: engine <-> workers in :mod:`.engine_workers`, router <-> splitwise
instances in :mod:`.router_instances`. The cache manager exchanges no message: it raises
``cache_ready_signal`` (shared memory, :mod:`fastdeploy_mtp.ipc`) once the caches are
published, and its exit status tells the engine the rest.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

PROTOCOL_VERSION = 5
#: HTTP header that carries the protocol version of a splitwise request or answer.
VERSION_HEADER = "X-FastDeploy-MTP-Protocol"


class MessageError(ValueError):
    """A message this process cannot read: malformed, or of another protocol version.

    Attributes:
        field: the first field at fault (dotted path), when one is.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def check_version(got: object, sender: str) -> None:
    """Raises :class:`MessageError` unless ``got`` (a message's version) is
    :data:`PROTOCOL_VERSION`."""
    if got is None:
        raise MessageError(
            f"{sender} sent no protocol version; this process speaks version {PROTOCOL_VERSION}"
        )
    if got != PROTOCOL_VERSION:
        raise MessageError(
            f"{sender} speaks protocol version {got!r}; this process speaks version "
            f"{PROTOCOL_VERSION}"
        )


def check_header_version(value: str | None, sender: str) -> None:
    """:func:`check_version` of an HTTP :data:`VERSION_HEADER` value (``None``: absent)."""
    try:
        got: object = None if value is None else int(value)
    except ValueError:
        got = value
    check_version(got, sender)


def version_headers() -> dict[str, str]:
    """The HTTP headers a splitwise request or 200 answer carries."""
    return {VERSION_HEADER: str(PROTOCOL_VERSION)}


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def encode(self) -> bytes:
        """The JSON bytes on the wire."""
        return self.model_dump_json().encode()


class Versioned(Message):
    version: int = PROTOCOL_VERSION


def refusal(exc: ValidationError, what: str) -> MessageError:
    """The :class:`MessageError` of a failed validation: its first error, the field it names."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    detail = f"{where}: {first['msg']}" if where else str(first["msg"])
    return MessageError(f"malformed {what}: {detail}{more}", where or None)
