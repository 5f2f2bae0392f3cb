"""Load for fault-injection tests: client threads sending streaming completions and what
each request ended with."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = ["The quick brown fox", "def area(r): return", "Once upon a time, in a"]


@dataclass
class Outcome:
    started: float
    ended: float = 0.0
    kind: str = ""  # "ok", "error" (an answer a client can read), "refused" (no connection), "hung"
    detail: str = ""


@dataclass
class Load:
    """``clients`` threads sending streaming completions to ``url`` until stopped; a client
    gives up on a request after ``client_timeout`` seconds without a byte (then "hung")."""

    url: str
    client_timeout: float
    clients: int = 3
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for i in range(self.clients):
            t = threading.Thread(
                target=self._client, args=(PROMPTS[i % len(PROMPTS)],), daemon=True
            )
            t.start()
            self.threads.append(t)

    def _client(self, prompt: str) -> None:
        body = {"model": "fastdeploy-mtp-tiny", "prompt": prompt, "max_tokens": 48, "stream": True}
        with httpx.Client(timeout=httpx.Timeout(self.client_timeout, connect=5)) as client:
            while not self.stop.is_set():
                out = Outcome(time.monotonic())
                self.outcomes.append(out)
                out.kind, out.detail = self._one(client, body)
                out.ended = time.monotonic()
                if out.kind == "refused":
                    time.sleep(0.2)

    def _one(self, client: httpx.Client, body: dict[str, Any]) -> tuple[str, str]:
        """One request: ("ok", text), ("error", message), ("refused", why) or ("hung", why)."""
        text: list[str] = []
        try:
            with client.stream("POST", self.url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    return "error", f"{r.status_code} {error_message(r.text)}"
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        return "ok", "".join(text)
                    event = json.loads(data)
                    if "error" in event:
                        return "error", f"stream: {event['error'].get('message', event)}"
                    text.append(event["choices"][0]["text"])
            return "error", "the stream ended without [DONE]"
        except httpx.TimeoutException as exc:
            return "hung", f"no answer: {type(exc).__name__}"
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            return "refused", f"{type(exc).__name__}: {exc}"

    def after(self, t: float) -> list[Outcome]:
        """The requests that ended at or after ``t``."""
        return [o for o in self.outcomes if o.ended >= t]

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(self.client_timeout + 30)
            assert not t.is_alive(), "a client is still waiting"


def error_message(text: str) -> str:
    """The message of an OpenAI-shaped error body (the body itself if it is not one)."""
    try:
        return json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"not OpenAI's error shape: {text[:200]!r}"
