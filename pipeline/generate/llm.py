"""Providers: where completions come from.

    provider = make_provider(model_cfg, cfg.base_dir)
    completion = await provider.complete(ChatRequest(task=..., backend="cuda", messages=..., sample=0))

A provider never raises for a failed call: the Completion carries the error, so one bad
request cannot stop a batch. Misconfiguration (a missing key, a broken replay file) raises
ProviderError when the provider is built, before any request is sent.
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
            self._client = openai.AsyncOpenAI(
                base_url=self.cfg.base_url, api_key=self._api_key,
                max_retries=self.cfg.max_retries, timeout=self.cfg.timeout_s)
            self._semaphore = asyncio.Semaphore(self.cfg.max_concurrency)
            self._loop = loop
        return self._client, self._semaphore

    async def complete(self, request: ChatRequest) -> Completion:
        client, semaphore = self._bound()
        async with semaphore:
            # Timed inside the semaphore: queueing behind our own requests is not the server's time.
            start = time.perf_counter()
            try:
                response = await client.chat.completions.create(
                    model=self.cfg.model, messages=request.messages,  # type: ignore[arg-type]
                    **self._sampling)
            except openai.APIError as exc:
                return Completion(error=f"{type(exc).__name__}: {exc.message}",
                                  seconds=time.perf_counter() - start)
            seconds = time.perf_counter() - start
        if not response.choices:
            return Completion(error="EmptyResponse: the server returned no choices",
                              model_id=response.model or "", usage=_usage(response.usage),
                              seconds=seconds)
        choice = response.choices[0]
        return Completion(
            text=choice.message.content or "",
            reasoning=self._reasoning(choice.message),
            usage=_usage(response.usage),
            model_id=response.model or "",
            finish_reason=choice.finish_reason,
            seconds=seconds,
        )

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
