"""A small OpenAI-compatible chat-completions server on 127.0.0.1, for tests.

    with serve([Failure(429), Reply(content="```python\\n...```")]) as server:
        cfg = ModelConfig(name="m", provider="openai", model="x", base_url=server.base_url)
        ...
        assert server.requests[0].body["model"] == "x"

The script is consumed in order, one entry per request; the last entry answers every request
after it, so [Failure(500)] fails forever and [Failure(429), Reply()] fails once. An entry may be
a function of the request body that returns the Reply or Failure (tests/search_model.py). Drop()
closes the connection unanswered (a server that is down or restarting), Hang() reads the request
and sends nothing (a server stopped mid-request). A request with "stream": true is answered as
server-sent events, a few chunks of content, then the usage where stream_options asks for it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """A successful chat completion."""

    content: str | None = "ok"
    reasoning: str | None = None
    reasoning_field: str = "reasoning_content"
    """The message key the reasoning goes under (servers differ: reasoning_content, reasoning)."""
    finish_reason: str = "stop"
    model: str | None = None
    """The model id answered as; None echoes the requested one."""
    prompt_tokens: int = 11
    completion_tokens: int = 22
    reasoning_tokens: int | None = None
    """None leaves completion_tokens_details out, as many local servers do."""
    delay_s: float = 0.0
    """Seconds to wait before answering, to hold requests in flight."""


@dataclass(frozen=True)
class Failure:
    """An HTTP error answer."""

    status: int
    message: str = "scripted failure"
    retry_after_ms: int | None = 10
    """Sent as retry-after-ms, which the openai SDK honours: keeps retry tests fast."""


@dataclass(frozen=True)
class Drop:
    """No answer: the connection is closed as soon as the request is read."""


@dataclass(frozen=True)
class Hang:
    """No answer for `seconds` (or until the server stops), the connection held open."""

    seconds: float = 60.0


@dataclass
class Received:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: Any

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization")


@dataclass
class ChatServer:
    base_url: str
    script: Sequence[Reply | Failure | Drop | Hang]
    max_requests: int
    requests: list[Received] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    """The most requests the server was answering at once."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: threading.Event = field(default_factory=threading.Event)

    def _next(self, received: Received) -> Reply | Failure | Drop | Hang | None:
        with self._lock:
            if len(self.requests) >= self.max_requests:
                return None
            step = self.script[min(len(self.requests), len(self.script) - 1)]
            self.requests.append(received)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return step

    def _done(self) -> None:
        with self._lock:
            self.in_flight -= 1


def _completion_body(reply: Reply, request: Any, number: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.reasoning is not None:
        message[reply.reasoning_field] = reply.reasoning
    usage: dict[str, Any] = {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }
    if reply.reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reply.reasoning_tokens}
    requested = request.get("model", "") if isinstance(request, dict) else ""
    return {
        "id": f"chatcmpl-test-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.model if reply.model is not None else requested,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason,
                     "logprobs": None}],
        "usage": usage,
    }


def _chunks(reply: Reply, request: Any, number: int) -> list[dict[str, Any]]:
    """The reply as a chat.completion.chunk stream: the role, the reasoning and the content in
    pieces, the finish reason, then (where asked) a last chunk with only the usage."""
    whole = _completion_body(reply, request, number)
    head = {k: whole[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if reply.reasoning is not None:
        deltas.append({reply.reasoning_field: reply.reasoning})
    content = reply.content or ""
    step = max(1, len(content) // 3)
    deltas += [{"content": content[i:i + step]} for i in range(0, len(content), step)]
    chunks = [head | {"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
    options = request.get("stream_options") if isinstance(request, dict) else None
    if isinstance(options, dict) and options.get("include_usage"):
        chunks.append(head | {"choices": [], "usage": whole["usage"]})
    return chunks


def _handler(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep pytest output clean

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, chunks: list[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                body = raw.decode(errors="replace")
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            received = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            step = server._next(received)
            if step is None:
                # Past the cap: tell the SDK not to retry, so a runaway test ends quickly.
                self._send(410, {"error": {"message": "request cap reached", "type": "test"}},
                           {"x-should-retry": "false"})
                return
            try:
                if callable(step):  # a responder: the answer depends on what was asked
                    step = step(body)
                if isinstance(step, Drop):
                    self.close_connection = True
                    return
                if isinstance(step, Hang):
                    server.stopped.wait(step.seconds)
                    self.close_connection = True
                    return
                if isinstance(step, Failure):
                    headers = ({"retry-after-ms": str(step.retry_after_ms)}
                               if step.retry_after_ms is not None else {})
                    self._send(step.status, {"error": {"message": step.message,
                                                       "type": "server_error"}}, headers)
                    return
                if step.delay_s:
                    time.sleep(step.delay_s)
                if isinstance(body, dict) and body.get("stream"):
                    self._stream(_chunks(step, body, len(server.requests)))
                else:
                    self._send(200, _completion_body(step, body, len(server.requests)))
            finally:
                server._done()

    return Handler


@contextmanager
def serve(script: Sequence[Reply | Failure | Drop | Hang] = (Reply(),), max_requests: int = 100) -> Iterator[ChatServer]:
    """Run the server for the duration of the with block; yields it (its base_url ends in /v1)."""
    if not script:
        raise ValueError("the script needs at least one entry")
    state = ChatServer(base_url="", script=list(script), max_requests=max_requests)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    httpd.daemon_threads = True
    state.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.stopped.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
