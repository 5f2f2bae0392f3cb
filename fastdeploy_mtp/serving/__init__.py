"""``fastdeploy-mtp serve``: an OpenAI-compatible server over FastDeploy's process layout.

* :mod:`.api_server` — the API server + engine process (FastAPI, the scheduler loop, detokenization,
  SSE streaming, ``/metrics``);
* :mod:`.cache_manager` — the process that creates every KV cache and publishes it by name;
* :mod:`fastdeploy_mtp.serving.worker_process` — one process per tensor-parallel rank (target runner +
  ``MTPProposer``), attaching the caches by name;
* :mod:`.workers` — the engine's side of the workers (:class:`~.workers.RemoteRunner`);
* :mod:`.protocol` — what the engine and the workers say to each other;
* :mod:`.layout` — the settings every process derives its config from;
* :mod:`.server` — ``fastdeploy-mtp serve`` (start-up, uvicorn, shutdown);
* :mod:`.metrics` — ``/metrics``;
* :mod:`.splitwise_api` — what a ``--splitwise-role prefill`` or ``decode`` instance adds
  (``/v1/splitwise/*``, the KV source or the KV pulls);
* :mod:`.router` — ``fastdeploy-mtp router``, the OpenAI front end of splitwise serving.

See ``docs/architecture.md``, "Serving processes" and "Splitwise prefill/decode".
"""
