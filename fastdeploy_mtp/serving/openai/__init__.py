"""The OpenAI-compatible HTTP front end shared by ``serve`` and the router: the app and its
endpoints (:mod:`.app`), the request bodies and sampling fields (:mod:`.protocol`), which
fields a body may carry (:mod:`.request_fields`), a completion's prompts (:mod:`.prompts`),
who may call which endpoint (:mod:`.http_auth`), the engine requests behind one response
(:mod:`.choices`), a response's text and logprobs (:mod:`.text`), streamed responses
(:mod:`.streaming`) and the uvicorn server (:mod:`.http_server`)."""
