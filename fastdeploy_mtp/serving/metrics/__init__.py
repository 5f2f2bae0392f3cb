"""``/metrics``: what ``serve`` and the router count, in Prometheus text format.

* :mod:`.families` — the ``fastdeploy:`` names and the text format (:func:`~.families.render`);
* :mod:`.counters` — how requests ended and a decode instance's KV transfers;
* :mod:`.engine_collector` — ``serve``'s series (requests, KV and prefix cache, splitwise,
  latency), read from the engine at scrape time;
* :mod:`.speculation` — the speculative-decoding and structured-output series;
* :mod:`.latency` — the latency histograms and when each request is observed;
* :mod:`.router_collector` — the router's series and the refused messages of both.
"""
