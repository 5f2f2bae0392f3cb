"""Shared memory and signals between processes: :mod:`.signals` (FastDeploy's ``IPCSignal``)
and :mod:`.kv_caches` (the KV cache names, and attaching caches another process created)."""
