"""Splitwise (disaggregated) prefill/decode serving with MTP.

A prefill instance runs the target and the MTP layer over a prompt, emits the first token,
drafts the first MTP tokens, and hands the request over; a decode instance continues it
from exactly that state. What crosses over is described in ``docs/architecture.md``
("Splitwise prefill/decode"): the request's slot state (:mod:`.handoff`) and its KV blocks
of every target layer and every MTP layer.

The KV transfer, by responsibility: :mod:`.kv_layout` (what P's and D's caches must agree
on, the argument checks), :mod:`.control` (the control protocol between D and P's source),
:mod:`.descriptor` (what travels from P to D with a request), :mod:`.transport` (the abstract
:class:`~.transport.Transport` and the registry), :mod:`.transports` (one module per
transport: ``shm``, ``mooncake``, ``tcp``), :mod:`.addresses` (which local address another
host reaches), :mod:`.offers` (the offers P's source holds), :mod:`.kv_source` (P's server,
:class:`~.kv_source.KVSource`) and :mod:`.kv_client` (D's :func:`~.kv_client.pull_blocks`).
"""
