"""Reference host engine runtime: processes, shared memory and signals (see docs/architecture.md)."""
