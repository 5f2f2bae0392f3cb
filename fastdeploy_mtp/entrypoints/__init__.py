"""The ``fastdeploy-mtp`` commands: :mod:`.cli` (the parser, error reporting, exit status)
and one module per command (:mod:`.serve`, :mod:`.router`, :mod:`.generate`, :mod:`.demo`).

A leaf of the package: nothing in ``fastdeploy_mtp`` imports it. The options the commands
share, and the configs they build, are :mod:`fastdeploy_mtp.engine_args`'s.
"""
