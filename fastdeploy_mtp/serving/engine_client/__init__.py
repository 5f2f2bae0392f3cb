"""The engine side of the API server: what the app needs from the thing that generates and
how a request's events reach its handler (:mod:`.backend`), and ``serve``'s backend, the
engine loop in a thread (:mod:`.engine_loop`)."""
