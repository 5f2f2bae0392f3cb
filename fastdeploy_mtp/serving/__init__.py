"""``fastdeploy-mtp serve``: an OpenAI-compatible server over FastDeploy's process layout.

* :mod:`.app` — the OpenAI HTTP app (FastAPI: completions, chat, SSE streaming, ``/health``,
  ``/metrics``) over a backend, and uvicorn;
* :mod:`.openai_protocol` — the OpenAI request bodies, errors, sampling fields, chat template;
* :mod:`.http_auth` — who may call which endpoint (API key, router token) and OpenAI-shaped
  errors for what the framework answers itself;
* :mod:`.engine_client` — the backend surface and the engine loop thread (``serve``'s backend);
* :mod:`.text` — a response's text and logprobs as its tokens arrive;
* :mod:`.cache_manager` — the process that creates every KV cache and publishes it by name;
* :mod:`fastdeploy_mtp.serving.worker_process` — one process per tensor-parallel rank (target runner +
  ``MTPProposer``), attaching the caches by name;
* :mod:`.child_process` — how those child processes stop (signals, parent death);
* :mod:`.workers` — the engine's side of the workers (:class:`~.workers.RemoteRunner`);
* :mod:`.runtime_dir` — a deployment's private runtime directory (the worker socket, its owner);
* :mod:`.messages` — every message between the processes (typed, versioned);
* :mod:`.layout` — the settings every process derives its config from;
* :mod:`.server` — ``fastdeploy-mtp serve`` (start-up, uvicorn, shutdown);
* :mod:`.metrics` — ``/metrics`` (the engine's and the router's counters);
* :mod:`.splitwise_api` — what a ``--splitwise-role prefill`` or ``decode`` instance adds
  (``/v1/splitwise/*``, the KV source or the KV pulls);
* :mod:`.router_server` — ``fastdeploy-mtp router``, the OpenAI front end of splitwise serving, over
  :mod:`.router_backend` (forwarding, retries).

See ``docs/architecture.md``, "Serving processes", "Splitwise prefill/decode" and "Trust model".
"""
