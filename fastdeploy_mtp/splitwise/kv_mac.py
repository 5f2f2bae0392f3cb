"""The MACs of what a prefill instance's KV source ("P") sends a decode instance ("D"): its
answers to control requests and the bytes of the offered blocks, so that D takes KV only
from a holder of the deployment's KV key, for this request, offer and position.

Both are made with the KV key (:func:`fastdeploy_mtp.credentials.derive` of the splitwise
secret for ``"kv"``, the key D signs its control requests with), each over a message whose
first element names its direction, so none can pass for another:

* a control request's ``mac`` covers ``[op, request_id, token, (first)]`` (:mod:`.control`);
* an answer's ``mac`` (:func:`answer_mac`) covers ``["kv-answer", op, request_id, token,
  first, <the answer's header without its mac>]``;
* a block frame's tag (:func:`frame_tag`) covers ``["kv-frame", request_id, token, first,
  index, count, nbytes]`` followed by the frame's bytes: the ``index``-th of ``count``
  frames (rank-major: rank ``index // num_caches``, cache ``index % num_caches``) of the
  offer's blocks ``block_ids[first:]``.

The token is the offer's own random transfer token, so a tag binds the offer as well as the
request id: a frame of another request or offer, of another position, of another length, or
a set of frames with one missing fails. An answer carries the tags of its frames in its
header (``"tags"``), which the answer's mac covers.

The frame tags are HMAC-SHA256, streamed over each frame in one pass. Over blocks of KV the
hash is the whole cost; the CPUs that serve GPUs (AMD Zen, Intel since Ice Lake) have SHA
instructions, with which OpenSSL's SHA-256 (what :mod:`hmac` runs) hashes about 2 GB/s per
core, faster than keyed BLAKE2b (about 1-1.4 GB/s; both measured by
``scripts/bench_kv_mac.py``). HMAC's second pass covers 32 bytes only, so an HMAC over a
separate digest of the frame would cost the same hash.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any

from ..credentials import canonical, sign, strings_equal
from .kv_layout import TransferError

__all__ = ["Refused", "answer_mac", "check_answer", "check_tags", "frame_tag", "frame_tags"]

#: The first element of what an answer's mac covers.
ANSWER = "kv-answer"
#: The first element of what a frame's tag covers.
FRAME = "kv-frame"


class Refused(TransferError):
    """An answer or frame from the source whose MAC does not hold (D counts it as dropped)."""


def answer_mac(
    key: bytes, op: str, request_id: str, token: str, first: int, header: dict[str, Any]
) -> str:
    """The ``mac`` of P's answer ``header`` to ``op`` (the ``mac`` key itself left out)."""
    body = {k: v for k, v in header.items() if k != "mac"}
    return sign(key, [ANSWER, op, request_id, token, first, body])


def frame_tag(
    key: bytes, request_id: str, token: str, first: int, index: int, count: int, data: Any
) -> str:
    """The hex tag of frame ``index`` of ``count`` of an answer: ``data``, a C-contiguous
    buffer (a numpy array of any dtype, or bytes)."""
    view = memoryview(data).cast("B")
    position = canonical([FRAME, request_id, token, first, index, count, view.nbytes])
    mac = hmac.new(key, len(position).to_bytes(4, "big") + position, "sha256")
    mac.update(view)
    return mac.hexdigest()


def frame_tags(
    key: bytes, request_id: str, token: str, first: int, frames: Iterable[Any], count: int
) -> list[str]:
    """The tag of each of the ``count`` frames of ``frames``, in order (:func:`frame_tag`).
    ``frames`` may make each frame as it is taken (D's copy of one cache's blocks at a
    time)."""
    return [frame_tag(key, request_id, token, first, i, count, f) for i, f in enumerate(frames)]


def check_answer(
    key: bytes, op: str, request_id: str, token: str, first: int, header: dict[str, Any]
) -> str | None:
    """What is wrong with P's ``header`` (an ``ok`` answer to ``op``) under ``key``; ``None``
    when its ``mac`` holds."""
    mac = header.get("mac")
    if not isinstance(mac, str):
        return "it carries no mac"
    try:
        expected = answer_mac(key, op, request_id, token, first, header)
    except (TypeError, ValueError):
        return "it cannot be signed (not plain JSON)"
    if not strings_equal(mac, expected):
        return "its mac does not hold under this deployment's KV key"
    return None


def check_tags(header: dict[str, Any], count: int, where: str) -> list[str]:
    """The ``tags`` of an authenticated answer ``header``: ``count`` hex str, else
    :class:`Refused`."""
    tags = header.get("tags")
    if (
        not isinstance(tags, list)
        or len(tags) != count
        or not all(isinstance(t, str) for t in tags)
    ):
        raise Refused(f"{where}: the answer does not carry one tag per frame ({count})")
    return tags
