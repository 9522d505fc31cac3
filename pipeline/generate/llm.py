"""Providers: where completions come from.

    provider = make_provider(model_cfg, cfg.base_dir)
    completion = await provider.complete(ChatRequest(task=..., backend="cuda", messages=..., sample=0))

A provider never raises for a failed call: the Completion carries the error, one line naming
the endpoint and the cause, so one bad request cannot stop a batch; `transient(error)` says whether
asking again may answer (a connection refused, a hung or overloaded server). Misconfiguration (a
missing key, a broken replay file) raises ProviderError when the provider is built, before any
request is sent.

The openai provider streams: a server that sends nothing for `idle_timeout_s` (before the first
chunk or between two) is given up as hung, long before `timeout_s`, which bounds the whole answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import openai
from pydantic import Field, ValidationError

from pipeline.config import ModelConfig
from pipeline.records import Backend, Completion, Record, Usage


# The failures that say nothing about the request itself: asking again later may be answered.
TRANSIENT = ("APIConnectionError", "APITimeoutError", "InternalServerError", "RateLimitError", "TimeoutError",
             "ConflictError")
ERROR_CAP = 400  # characters of a server's error body kept in the one-line error


def transient(error: str | None) -> bool:
    """Whether a failed call's stored error (Completion.error) is one that asking again may cure."""
    return bool(error) and error.split(":", 1)[0] in TRANSIENT


def _one_line(text: str, cap: int = ERROR_CAP) -> str:
    return " ".join(str(text).split())[:cap]


class ProviderError(ValueError):
    """A provider that cannot be built; the message is one line naming the model or file."""


class ChatRequest(Record):
    """One prompt to send, and which task and sample it belongs to."""

    task: str
    """Name of the reference task the prompt is about."""
    backend: Backend
    """The backend the kernel is asked for (cuda or cpu)."""
    messages: list[dict[str, str]]
    """Chat messages in OpenAI form: {"role": ..., "content": ...}."""
    sample: int
    """Which of the samples for this task this request is (0-based)."""
    turn: int = 0
    """Which turn of a search conversation this is (0: the first prompt); replay answers by it."""


class Provider(Protocol):
    async def complete(self, request: ChatRequest) -> Completion: ...


class OpenAIProvider:
    """Any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, SGLang, llama.cpp...)."""

    # Servers that keep reasoning apart from content name the field differently:
    # vLLM/SGLang/DeepSeek use reasoning_content, OpenRouter and newer vLLM use reasoning.
    _REASONING_FIELDS = ("reasoning_content", "reasoning")

    def __init__(self, cfg: ModelConfig, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        if cfg.api_key_env:
            key = env.get(cfg.api_key_env, "")
            if not key:
                raise ProviderError(
                    f"model {cfg.name}: environment variable {cfg.api_key_env} is not set")
        else:
            # Local servers ignore the key, but the SDK refuses to run without one.
            key = "not-needed"
        self.cfg = cfg
        self._api_key = key
        self._sampling = cfg.sampling.model_dump(exclude_none=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None

    def _bound(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        # A semaphore and an HTTP connection pool belong to one event loop, so they are made
        # inside the running loop, and made again if the provider is reused under a new one.
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._semaphore is None:
            idle = min(self.cfg.idle_timeout_s, self.cfg.timeout_s)
            # read: the longest silence between two chunks of the stream (or before the first).
            self._client = openai.AsyncOpenAI(
                base_url=self.cfg.base_url, api_key=self._api_key, max_retries=self.cfg.max_retries,
                timeout=openai.Timeout(self.cfg.timeout_s, connect=min(idle, 30.0), read=idle, write=idle))
            self._semaphore = asyncio.Semaphore(self.cfg.max_concurrency)
            self._loop = loop
        return self._client, self._semaphore

    def _error(self, exc: BaseException) -> str:
        """One line: the error's kind, the endpoint, and the cause (the server's words, or the
        connection's failure under the SDK's "Connection error.")."""
        if isinstance(exc, asyncio.TimeoutError):
            return (f"TimeoutError: {self.cfg.base_url}: no complete answer within timeout_s "
                    f"({self.cfg.timeout_s:g} s)")
        name = type(exc).__name__
        if isinstance(exc, openai.APITimeoutError):
            cause = (f"nothing received for {min(self.cfg.idle_timeout_s, self.cfg.timeout_s):g} s "
                     "(idle_timeout_s): the server is hung or too slow to start answering")
        elif isinstance(exc, openai.APIError):
            cause = exc.message
            if isinstance(exc, openai.APIConnectionError):
                chain, inner = [], exc.__cause__ or exc.__context__
                while inner is not None and len(chain) < 8:  # the transport's words, down to the socket's
                    chain.append(inner)
                    inner = inner.__cause__ or inner.__context__
                causes: list[str] = []
                for e in chain[:1] + chain[-1:]:
                    said = _one_line(e, 200)
                    if not any(said in c for c in causes):
                        causes.append(f"{type(e).__name__}: {said or 'no detail'}")
                cause += f" ({'; '.join(causes)})" if causes else ""
        else:
            cause = str(exc) or "no detail"
        return f"{name}: {self.cfg.base_url}: {_one_line(cause)}"

    async def complete(self, request: ChatRequest) -> Completion:
        client, semaphore = self._bound()
        async with semaphore:
            # Timed inside the semaphore: queueing behind our own requests is not the server's time.
            start = time.perf_counter()
            try:
                return await asyncio.wait_for(self._stream(client, request, start), self.cfg.timeout_s)
            except (openai.OpenAIError, asyncio.TimeoutError, OSError) as exc:
                return Completion(error=self._error(exc), seconds=time.perf_counter() - start)

    async def _stream(self, client: openai.AsyncOpenAI, request: ChatRequest, start: float) -> Completion:
        stream = await client.chat.completions.create(
            model=self.cfg.model, messages=request.messages,  # type: ignore[arg-type]
            stream=True, stream_options={"include_usage": True}, **self._sampling)
        text: list[str] = []
        reasoning: list[str] = []
        usage = model_id = finish_reason = None
        chosen = False
        async with stream:
            async for chunk in stream:
                model_id = chunk.model or model_id
                usage = chunk.usage or usage
                for choice in chunk.choices[:1] if chunk.choices and chunk.choices[0].index == 0 else []:
                    chosen = True
                    if choice.delta is not None:
                        text.append(choice.delta.content or "")
                        reasoning.append(self._reasoning(choice.delta) or "")
                    finish_reason = choice.finish_reason or finish_reason
        seconds = time.perf_counter() - start
        if not chosen:
            return Completion(error=f"EmptyResponse: {self.cfg.base_url}: the server returned no choices",
                              model_id=model_id or "", usage=_usage(usage), seconds=seconds)
        return Completion(text="".join(text), reasoning="".join(reasoning) or None, usage=_usage(usage),
                          model_id=model_id or "", finish_reason=finish_reason, seconds=seconds)

    @classmethod
    def _reasoning(cls, message: Any) -> str | None:
        extra = getattr(message, "model_extra", None) or {}
        for field in cls._REASONING_FIELDS:
            value = getattr(message, field, None) or extra.get(field)
            if isinstance(value, str) and value:
                return value
        return None

    async def aclose(self) -> None:
        """Close the HTTP client of the current loop (optional; it is dropped with the provider)."""
        if self._client is not None:
            await self._client.close()
            self._client = None


def _usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    details = getattr(usage, "completion_tokens_details", None)
    return Usage(
        prompt_tokens=getattr(usage, "prompt_tokens", None) or 0,
        completion_tokens=getattr(usage, "completion_tokens", None) or 0,
        reasoning_tokens=getattr(details, "reasoning_tokens", None) or 0,
    )


class _ReplayEntry(Record):
    task: str
    backend: Backend
    text: str
    turn: int | None = None
    """The turn of a search conversation this entry answers; None answers any turn."""
    reasoning: str | None = None
    usage: Usage = Field(default_factory=Usage)


class ReplayProvider:
    """Recorded completions from a JSONL file: reruns without a model, and tests. An entry with a
    `turn` answers only that turn of a search's conversations, so a recorded search replays."""

    def __init__(self, cfg: ModelConfig, base_dir: Path) -> None:
        if not cfg.replay_file:
            raise ProviderError(f"model {cfg.name}: provider replay needs replay_file")
        path = Path(cfg.replay_file)
        self.path = path if path.is_absolute() else Path(base_dir) / path
        self.cfg = cfg
        self._entries: dict[tuple[str, str], list[_ReplayEntry]] = {}
        for entry in self._read(self.path, cfg.name):
            self._entries.setdefault((entry.task, entry.backend), []).append(entry)

    @staticmethod
    def _read(path: Path, name: str) -> list[_ReplayEntry]:
        if not path.is_file():
            raise ProviderError(f"model {name}: replay file {path} does not exist")
        entries = []
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ProviderError(f"{path} line {lineno}: not JSON: {exc.msg}") from None
                if not isinstance(data, dict):
                    raise ProviderError(
                        f"{path} line {lineno}: expected a JSON object, got {type(data).__name__}")
                try:
                    entries.append(_ReplayEntry.model_validate(data))
                except ValidationError as exc:
                    err = exc.errors()[0]
                    where = ".".join(str(p) for p in err["loc"])
                    raise ProviderError(f"{path} line {lineno}: {where}: {err['msg']}") from None
        return entries

    async def complete(self, request: ChatRequest) -> Completion:
        entries = self._entries.get((request.task, request.backend), [])
        # A recorded conversation: the entries for this turn; else those that answer any turn.
        entries = [e for e in entries if e.turn == request.turn] or [e for e in entries if e.turn is None]
        if not entries:
            return Completion(error=f"replay: no recorded completion for task {request.task} "
                                    f"on backend {request.backend} at turn {request.turn}")
        entry = entries[request.sample % len(entries)]
        return Completion(text=entry.text, reasoning=entry.reasoning, usage=entry.usage,
                          model_id=self.cfg.model or "replay", finish_reason="stop")


def make_provider(cfg: ModelConfig, base_dir: Path,
                  env: Mapping[str, str] | None = None) -> Provider:
    if cfg.provider == "openai":
        return OpenAIProvider(cfg, env)
    if cfg.provider == "replay":
        return ReplayProvider(cfg, base_dir)
    raise ProviderError(f"model {cfg.name}: unknown provider {cfg.provider!r}")
