"""Splitwise (disaggregated) prefill/decode serving with MTP.

A prefill instance runs the target and the MTP layer over a prompt, emits the first token,
drafts the first MTP tokens, and hands the request over; a decode instance continues it
from exactly that state. What crosses over is described in ``docs/architecture.md``
("Splitwise prefill/decode"): the request's slot state (:mod:`.handoff`) and its KV blocks
of every target layer and every MTP layer (:mod:`.kv_transfer`).
"""
