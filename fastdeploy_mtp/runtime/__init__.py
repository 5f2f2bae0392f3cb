"""The reference host engine: target runner, scheduler, generation loop, IPC helpers."""
