import asyncio
import json
from pathlib import Path

import pytest
import time

from chat_server import Drop, Failure, Hang, Reply, serve

from pipeline.config import ModelConfig, Sampling
from pipeline.generate.llm import ChatRequest, OpenAIProvider, ProviderError, ReplayProvider, make_provider, transient
from pipeline.records import Completion

MESSAGES = [{"role": "system", "content": "You write kernels."},
            {"role": "user", "content": "Write ModelNew for relu."}]


def request(task: str = "relu", backend: str = "cuda", sample: int = 0) -> ChatRequest:
    return ChatRequest(task=task, backend=backend, messages=MESSAGES, sample=sample)


def openai_cfg(base_url: str, **kw) -> ModelConfig:
    return ModelConfig(name="local", provider="openai", model=kw.pop("model", "qwen-coder"),
                       base_url=base_url, **kw)


def complete(provider, req: ChatRequest) -> Completion:
    return asyncio.run(provider.complete(req))


def test_openai_provider_returns_content_reasoning_usage_and_sends_params():
    reply = Reply(content="```python\nclass ModelNew: pass\n```", reasoning="think hard",
                  model="served-id", finish_reason="length", prompt_tokens=31,
                  completion_tokens=400, reasoning_tokens=250)
    with serve([reply]) as server:
        cfg = openai_cfg(server.base_url,
                         sampling=Sampling(temperature=0.6, max_tokens=2048, seed=7))
        c = complete(make_provider(cfg, base_dir=Path("."), env={}), request())

    assert c.error is None
    assert c.text == reply.content
    assert c.reasoning == "think hard"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.reasoning_tokens) == (31, 400, 250)
    assert c.model_id == "served-id"
    assert c.finish_reason == "length"
    assert c.seconds > 0

    [sent] = server.requests
    assert sent.body["model"] == "qwen-coder"
    assert sent.body["messages"] == MESSAGES
    assert sent.body["temperature"] == 0.6
    assert sent.body["max_tokens"] == 2048
    assert sent.body["seed"] == 7
    # None-valued sampling fields leave the server's default alone.
    assert "top_p" not in sent.body
    assert sent.authorization == "Bearer not-needed"


def test_reasoning_under_the_reasoning_key_and_no_token_details():
    with serve([Reply(content="answer", reasoning="chain", reasoning_field="reasoning")]) as server:
        c = complete(OpenAIProvider(openai_cfg(server.base_url), env={}), request())
    assert c.text == "answer"
    assert c.reasoning == "chain"
    assert c.usage.reasoning_tokens == 0
    assert c.usage.prompt_tokens == 11


def test_api_key_read_from_named_env_var_and_sent_as_bearer():
    with serve() as server:
        cfg = openai_cfg(server.base_url, api_key_env="KGEN_TEST_KEY")
        c = complete(OpenAIProvider(cfg, env={"KGEN_TEST_KEY": "sk-test-123"}), request())
    assert c.error is None
    assert server.requests[0].authorization == "Bearer sk-test-123"


@pytest.mark.parametrize("env", [{}, {"KGEN_TEST_KEY": ""}])
def test_missing_env_var_fails_at_construction(env):
    cfg = openai_cfg("http://127.0.0.1:9/v1", api_key_env="KGEN_TEST_KEY")
    with pytest.raises(ProviderError) as info:
        make_provider(cfg, base_dir=Path("."), env=env)
    assert str(info.value) == "model local: environment variable KGEN_TEST_KEY is not set"


def test_429_then_500_then_success_is_retried():
    with serve([Failure(429), Failure(500), Reply(content="third time")]) as server:
        c = complete(OpenAIProvider(openai_cfg(server.base_url, max_retries=3), env={}), request())
    assert c.error is None
    assert c.text == "third time"
    assert len(server.requests) == 3
    assert [r.headers.get("x-stainless-retry-count") for r in server.requests] == ["0", "1", "2"]


def test_always_500_gives_error_completion_not_exception():
    with serve([Failure(500, message="kaboom")]) as server:
        c = complete(OpenAIProvider(openai_cfg(server.base_url, max_retries=1), env={}), request())
    assert c.text == ""
    assert c.error is not None
    assert c.error.startswith("InternalServerError: ")
    assert "kaboom" in c.error
    assert len(server.requests) == 2  # the first try and one retry


def test_unreachable_server_gives_connection_error_completion():
    with serve() as server:
        url = server.base_url
    # The server is gone now, so the port refuses connections.
    c = complete(OpenAIProvider(openai_cfg(url, max_retries=0), env={}), request())
    assert c.error is not None
    assert c.error.startswith("APIConnectionError: ")


def test_an_endpoint_error_is_one_line_naming_the_endpoint_and_the_cause():
    with serve() as server:
        url = server.base_url
    refused = complete(OpenAIProvider(openai_cfg(url, max_retries=0), env={}), request())
    assert refused.error.startswith(f"APIConnectionError: {url}: Connection error. (ConnectError: ")
    assert "refused" in refused.error.lower() and "\n" not in refused.error and transient(refused.error)
    with serve([Drop()]) as server:  # a server going down mid-request
        dropped = complete(OpenAIProvider(openai_cfg(server.base_url, max_retries=0), env={}), request())
    assert dropped.error.startswith(f"APIConnectionError: {server.base_url}: ") and transient(dropped.error)
    with serve([Failure(400, message="bad\nrequest " + "x" * 2000, retry_after_ms=None)]) as server:
        bad = complete(OpenAIProvider(openai_cfg(server.base_url, max_retries=0), env={}), request())
    assert bad.error.startswith(f"BadRequestError: {server.base_url}: Error code: 400")
    assert "\n" not in bad.error and len(bad.error) < 500 and not transient(bad.error)
    with serve([Failure(503)]) as server:
        assert transient(complete(OpenAIProvider(openai_cfg(server.base_url, max_retries=0), env={}), request()).error)


def test_a_hung_endpoint_is_noticed_after_the_idle_limit_not_the_timeout():
    """A server that reads the request and sends nothing (one stopped mid-request): given up after
    idle_timeout_s, not timeout_s; a slow one that streams its answer is not cut."""
    with serve([Hang(30)]) as server:
        cfg = openai_cfg(server.base_url, max_retries=0, timeout_s=60, idle_timeout_s=0.5)
        start = time.monotonic()
        hung = complete(OpenAIProvider(cfg, env={}), request())
        waited = time.monotonic() - start
    assert waited < 5, waited
    assert hung.error.startswith(f"APITimeoutError: {server.base_url}: nothing received for 0.5 s (idle_timeout_s)")
    assert transient(hung.error)
    with serve([Reply(content="late but whole", delay_s=0.3)]) as server:
        cfg = openai_cfg(server.base_url, max_retries=0, timeout_s=0.1, idle_timeout_s=5)
        late = complete(OpenAIProvider(cfg, env={}), request())
    assert late.error.startswith("APITimeoutError: ") or late.error.startswith("TimeoutError: "), late.error


def test_concurrency_is_bounded_and_provider_survives_a_new_loop():
    with serve([Reply(content="slow", delay_s=0.1)]) as server:
        provider = OpenAIProvider(openai_cfg(server.base_url, max_concurrency=2), env={})

        async def batch():
            return await asyncio.gather(*(provider.complete(request(sample=i)) for i in range(6)))

        results = asyncio.run(batch())
        # A second asyncio.run gets a fresh loop; the provider must not reuse the old one's objects.
        again = complete(provider, request())

    assert [r.text for r in results] == ["slow"] * 6
    assert again.text == "slow"
    assert server.max_in_flight == 2
    assert len(server.requests) == 7


def write_replay(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def replay_cfg(file: str = "replay.jsonl") -> ModelConfig:
    return ModelConfig(name="rec", provider="replay", replay_file=file)


def test_replay_cycles_samples_per_task_and_backend(tmp_path):
    write_replay(tmp_path / "replay.jsonl", [
        {"task": "relu", "backend": "cuda", "text": "a", "reasoning": "why a",
         "usage": {"prompt_tokens": 5, "completion_tokens": 9}},
        {"task": "relu", "backend": "cpu", "text": "cpu-only"},
        "",
        {"task": "relu", "backend": "cuda", "text": "b", "reasoning": None},
    ])
    provider = make_provider(replay_cfg(), base_dir=tmp_path)
    assert isinstance(provider, ReplayProvider)
    texts = [complete(provider, request(sample=s)).text for s in range(5)]
    assert texts == ["a", "b", "a", "b", "a"]

    first = complete(provider, request(sample=2))
    assert first.reasoning == "why a"
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (5, 9)
    assert first.error is None
    assert complete(provider, request(backend="cpu", sample=3)).text == "cpu-only"


def test_replay_missing_task_gives_error_completion(tmp_path):
    write_replay(tmp_path / "replay.jsonl", [{"task": "relu", "backend": "cuda", "text": "a"}])
    provider = ReplayProvider(replay_cfg(), tmp_path)
    c = complete(provider, request(task="softmax", backend="cuda"))
    assert c.error == "replay: no recorded completion for task softmax on backend cuda at turn 0"
    assert c.text == ""
    c = complete(provider, request(task="relu", backend="cpu"))
    assert c.error == "replay: no recorded completion for task relu on backend cpu at turn 0"


def test_replay_bad_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "replay.jsonl"
    write_replay(path, [{"task": "relu", "backend": "cuda", "text": "a"}, "{not json"])
    with pytest.raises(ProviderError) as info:
        ReplayProvider(replay_cfg(), tmp_path)
    assert str(info.value).startswith(f"{path} line 2: not JSON")


def test_replay_line_lacking_a_key_names_file_line_and_key(tmp_path):
    path = tmp_path / "replay.jsonl"
    write_replay(path, [{"task": "relu", "backend": "cuda", "text": "a"},
                        {"task": "relu", "backend": "cuda", "text": "b"},
                        {"task": "relu", "backend": "cuda"}])
    with pytest.raises(ProviderError) as info:
        ReplayProvider(replay_cfg(), tmp_path)
    assert str(info.value) == f"{path} line 3: text: Field required"


def test_replay_missing_file(tmp_path):
    with pytest.raises(ProviderError) as info:
        ReplayProvider(replay_cfg("nope.jsonl"), tmp_path)
    assert str(info.value) == f"model rec: replay file {tmp_path / 'nope.jsonl'} does not exist"
