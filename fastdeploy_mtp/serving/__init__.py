"""``fastdeploy-mtp serve`` and ``router``: an OpenAI-compatible server over FastDeploy's
process layout, and the router of splitwise (P/D) serving.

* :mod:`.openai` — the OpenAI HTTP app (completions, chat, SSE streaming, ``/health``,
  ``/metrics``), its request bodies and access rules, and uvicorn;
* :mod:`.engine_client` — the backend surface the app serves from, and ``serve``'s engine
  loop thread;
* :mod:`.processes` — ``serve``'s start-up and its processes: the cache manager, one worker
  per tensor-parallel rank, the engine's side of them, the runtime directory;
* :mod:`.token_channel` — how worker rank 0 hands each step's tokens to the engine;
* :mod:`.messages` — every message between the processes (typed, versioned);
* :mod:`.metrics` — ``/metrics`` (the engine's and the router's counters, latency);
* :mod:`.pd` — what a ``--splitwise-role prefill`` or ``decode`` instance adds
  (``/v1/splitwise/*``, the KV source or the KV pulls);
* :mod:`.router` — ``fastdeploy-mtp router``, the OpenAI front end of splitwise serving.

See ``docs/architecture.md``, "Serving processes", "Splitwise prefill/decode" and "Trust model".
"""
