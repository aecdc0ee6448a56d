"""What launching and talking to llama.cpp's ``llama-server`` takes: the built binary and the
generated model (``built``), its command line (``argv``), waiting for ``/health`` and a
``/completion`` client over a fixed prompt set with a fixed seed (``complete``).

The binary comes from scripts/build-llama (cached outside the checkout: only the first build
takes minutes); the model from ``llm.model``, cached beside it."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llm.model import model_path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "scripts" / "build-llama"
SEED = 42
# The prompt set every measurement sends, in this order: short, so the cost per request is the
# generation, not the prompt (the model is random weights: its answers are noise).
PROMPTS = (
    "The memory limit of a container is",
    "Once upon a time, in a data centre far away,",
    "def fibonacci(n):",
    "The kernel's OOM killer chooses its victim by",
    "A health probe that fails three times in a row",
    "Paris is the capital of",
    "The quick brown fox jumps over",
    "To restart a process after it crashed, a supervisor",
)


class BuildFailed(Exception):
    """scripts/build-llama failed: its last line says why."""


@dataclass(frozen=True, slots=True)
class Built:
    binary: Path
    model: Path


def built(timeout: float = 3600, quiet: bool = True) -> Built:
    """The llama-server binary and the generated model (built and written the first time;
    ``quiet`` keeps the build's progress off stderr). BuildFailed says why not."""
    try:
        r = subprocess.run(
            [str(BUILD)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if quiet else None,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildFailed(f"scripts/build-llama: {exc}") from exc
    if r.returncode != 0:
        why = (r.stderr or "").strip().splitlines()[-1:] or ["see its output above"]
        raise BuildFailed(why[0])
    binary = Path(r.stdout.strip().splitlines()[-1])
    cache = binary.parent
    return Built(binary, model_path(cache / "models", cache / "ggml-vocab-llama-spm.gguf"))


def argv(binary: Path, model: Path, port: int, *extra: str, threads: int = 2) -> list[str]:
    """llama-server on 127.0.0.1:``port`` with ``threads`` threads and no warm-up run (the load
    is what the tests watch). In this llama.cpp, loading without mmap is ``--load-mode none``
    (``--no-mmap`` is refused with exit 1)."""
    return [
        str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-t", str(threads), "--no-warmup", *extra,
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_of(url: str, timeout: float = 1) -> int:
    """The HTTP status the server answered (0: no answer)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def wait_healthy(port: int, timeout: float, alive: Callable[[], bool] | None = None) -> float:
    """Seconds until ``/health`` answered 200; TimeoutError after ``timeout``. ``alive``, a
    callable, stops the wait early (RuntimeError) when it returns False: the server died."""
    url = f"http://127.0.0.1:{port}/health"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if status_of(url, 0.5) == 200:
            return time.monotonic() - t0
        if alive is not None and not alive():
            raise RuntimeError("llama-server exited before it answered /health with 200")
        time.sleep(0.05)
    raise TimeoutError(f"llama-server did not answer /health with 200 in {timeout:g} s")


@dataclass(frozen=True, slots=True)
class Answer:
    latency_s: float  # the request, as the client saw it
    tokens: int  # tokens generated
    tokens_per_s: float  # the server's own generation rate (its "timings")


def complete(port: int, prompt: str, n_predict: int, seed: int = SEED) -> Answer:
    """One ``/completion`` request: greedy (temperature 0) with a fixed seed, always
    ``n_predict`` tokens (no stop at end of text), no prompt cache across requests."""
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "seed": seed,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        doc = json.loads(r.read())
    latency = time.monotonic() - t0
    timings = doc.get("timings", {})
    return Answer(
        latency,
        int(timings.get("predicted_n", doc.get("tokens_predicted", 0))),
        float(timings.get("predicted_per_second", 0.0)),
    )
