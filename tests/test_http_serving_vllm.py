"""The OpenAI-compatible server with a LiLiCorr draft, over real HTTP on a loopback port.

The server is started the documented way, `vllm-liliprop serve` (here its module form, which
needs no reinstall), as its own process tree (API server + engine core). Concurrent completion
and chat requests, streamed and not, must give at T = 0 exactly the text of plain decoding
(an in-process engine without speculation, built while the server starts), `/metrics` must count
speculative drafts, and terminating the server must leave no process behind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from tests.engine import ENGINE_FLAGS, PROMPTS
from vllm_liliprop.fixtures import build_tiny_lilicorr_draft

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
MAX_TOKENS = 24
CHATS = [[{"role": "user", "content": "def fib(n):"}],
         [{"role": "user", "content": "import os\nimport"}]]
START_TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(target: str, draft: Path, port: int) -> list[str]:
    spec = {"method": "dflash", "model": str(draft), "num_speculative_tokens": 7}
    return [sys.executable, "-m", "vllm_liliprop.vllm.cli", "serve", target,
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", ENGINE_FLAGS["dtype"], "--max-model-len", str(ENGINE_FLAGS["max_model_len"]),
            "--enforce-eager", "--speculative-config", json.dumps(spec)]


def wait_until_healthy(proc: subprocess.Popen, base: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"server not healthy after {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen) -> list[psutil.Process]:
    """Terminate the server and wait; the processes of its tree still alive afterwards."""
    try:
        server = psutil.Process(proc.pid)
        tree = [server, *server.children(recursive=True)]
    except psutil.NoSuchProcess:  # already exited (the test reports why)
        tree = []
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    _, alive = psutil.wait_procs(tree, timeout=15)
    for leftover in alive:  # never leave one behind, even when the test fails
        leftover.kill()
    return alive


def plain_reference(target: str) -> dict[str, list[str]]:
    """Plain greedy decoding of the same requests, in this process."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=target, **ENGINE_FLAGS)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    completions = [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    chats = [o.outputs[0].text for o in llm.chat(CHATS, params, use_tqdm=False)]
    del llm
    return {"completions": completions, "chats": chats}


def completion(client: httpx.Client, prompt: str, stream: bool) -> str:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    return _request(client, "/v1/completions", body, lambda choice: choice["text"], stream)


def chat(client: httpx.Client, messages: list[dict], stream: bool) -> str:
    body = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    if stream:
        return _request(client, "/v1/chat/completions", body,
                        lambda choice: choice["delta"].get("content") or "", stream)
    return _request(client, "/v1/chat/completions", body,
                    lambda choice: choice["message"]["content"], stream)


def _request(client, path, body, text_of, stream) -> str:
    if not stream:
        response = client.post(path, json=body)
        response.raise_for_status()
        return text_of(response.json()["choices"][0])
    parts = []
    with client.stream("POST", path, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[len("data: "):])["choices"]
            parts += [text_of(choice) for choice in choices]
    return "".join(parts)


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name) and not line.startswith("#")]
    assert values, f"{name} not in /metrics"
    return sum(values)


def test_console_script_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["vllm-liliprop"] == "vllm_liliprop.vllm.cli:main"


def test_openai_server_with_lilicorr_draft_matches_plain_decoding(tiny_models, tmp_path):
    draft = build_tiny_lilicorr_draft(tmp_path / "lilicorr", tiny_models["target"])
    port, log = free_port(), tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"
    # `vllm serve` always runs its engine core in a process of its own; with the flag at 0 the
    # model runs in that process (vLLM's uni executor), one process fewer to start.
    # INFO level: the test reads the rule's start-up line (the suite's own imports quiet vLLM).
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="INFO")
    with log.open("w") as out:
        proc = subprocess.Popen(serve_command(tiny_models["target"], draft, port), cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        plain = plain_reference(tiny_models["target"])  # loads while the server starts
        wait_until_healthy(proc, base, log)
        with httpx.Client(base_url=base, timeout=120) as client:
            jobs = [(completion, p, False) for p in PROMPTS] + [(completion, PROMPTS[0], True)]
            jobs += [(chat, m, False) for m in CHATS] + [(chat, CHATS[1], True)]
            with ThreadPoolExecutor(len(jobs)) as pool:
                futures = [pool.submit(fn, client, arg, stream) for fn, arg, stream in jobs]
                texts = [f.result() for f in futures]
            metrics = client.get("/metrics").text
    finally:
        leftovers = stop(proc)
    n = len(PROMPTS)
    assert texts[:n] == plain["completions"]
    assert texts[n] == plain["completions"][0]  # streamed
    assert texts[n + 1: n + 3] == plain["chats"]
    assert texts[n + 3] == plain["chats"][1]  # streamed
    assert metric(metrics, "vllm:spec_decode_num_drafts_total") > 0
    assert metric(metrics, "vllm:spec_decode_num_draft_tokens_total") > 0
    assert "vllm-liliprop draft rule ready: lattice-greedy" in log.read_text()
    assert leftovers == [], f"processes left after shutdown: {leftovers}"
