"""The OpenAI-compatible HTTP front end shared by ``serve`` and the router: the app and its
endpoints (:mod:`.app`), the request bodies and sampling fields (:mod:`.protocol`), who may
call which endpoint (:mod:`.http_auth`), the engine requests behind one response
(:mod:`.choices`), a response's text and logprobs (:mod:`.text`), streamed responses
(:mod:`.streaming`) and the uvicorn server (:mod:`.http_server`)."""
