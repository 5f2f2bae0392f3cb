"""The options of ``fastdeploy-mtp router`` (:class:`RouterOptions`) and their defaults,
light enough for the command line to import before anything heavy."""

from __future__ import annotations

from dataclasses import dataclass

from ...tenancy import AccessOptions


@dataclass
class RouterOptions(AccessOptions):
    """The ``router`` command's options, with their defaults (the one place they are
    written: :mod:`fastdeploy_mtp.entrypoints.router` defines the flags and takes its defaults
    from here)."""

    prefill: list[str]
    decode: list[str]
    host: str = "127.0.0.1"
    port: int = 8000
    queue_timeout: float = 600.0
    #: seconds an instance may stay silent before the request fails with 504
    instance_timeout: float = 60.0
    served_model_name: str | None = None
    start_timeout: float = 300.0
    #: the folder holding the served model's tokenizer files and ``generation_config.json``
    #: (the model folder the instances serve); ``None``: the shipped model's
    tokenizer: str | None = None
    #: ``--log-level``: ``"debug"``, ``"info"``, ``"warning"`` or ``"error"``
    log_level: str = "info"
