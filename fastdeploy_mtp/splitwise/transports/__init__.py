"""The KV transports, one module each (:mod:`.shm`, :mod:`.mooncake`, :mod:`.tcp`).

A module here defines a :class:`~fastdeploy_mtp.splitwise.transport.Transport` and
decorates it with :func:`~fastdeploy_mtp.splitwise.transport.register`. The registry
imports every module of this package the first time it is asked for a transport, so a new
transport is one new module here and nothing else: ``pull_blocks(transport=...)`` and
``"auto"`` find it, and its descriptor fields travel in every descriptor.
"""
