"""What launching and talking to llama.cpp's ``llama-server`` takes: the built binary and the
generated model (``built``), its command line (``argv``), waiting for ``/health``, a
``/completion`` client over a fixed prompt set with a fixed seed (``complete``) and waves of
long prompts sent a few at a time that fill the server's prompt cache (``prompt_waves``).

The binary comes from scripts/build-llama (cached outside the checkout: only the first build
takes minutes); the model from ``llm.model``, cached beside it."""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import threading
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


def complete(
    port: int, prompt: str, n_predict: int, seed: int = SEED, cache_prompt: bool = False
) -> Answer:
    """One ``/completion`` request: greedy (temperature 0) with a fixed seed, always
    ``n_predict`` tokens (no stop at end of text); no prompt cache across requests unless
    ``cache_prompt`` (the server's own default)."""
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "seed": seed,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": cache_prompt,
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


# A server whose prompt cache outgrows its container (issue 29): 4 slots of 1024 tokens, the KV
# cache in F32 (48 KiB a token for this model, twice F16's: the cache grows twice as fast per
# token computed, which is what costs time on 2 cores), 192 MiB of it zeroed at the start (the
# server's anon is ~203 MiB once loaded) and the prompt cache at its default (8 GiB). Under
# PROMPT_CACHE_LIMIT its anon after waves of prompt_waves' prompts was 260, 292, 338 MiB here
# (+32 to +65 MiB a wave: two to four 350-token prompts of 16 MiB) and the fourth wave was
# OOM-killed; with "--cache-ram", "0" added, it stays flat.
PROMPT_CACHE_ARGS = ("-c", "4096", "-np", "4", "-ctk", "f32", "-ctv", "f32")
PROMPT_CACHE_LIMIT = 400 << 20
# prompt_waves' cadence: a wave of clients every 8 s, time for each to be answered on 2 busy
# cores (2.4 s of prompt evaluation a batch of slots in CI) with a pause after
WAVE_EVERY_S = 8.0


def charged_here(model: Path) -> None:
    """Read the model once from this process: a page stays charged to the cgroup that read it
    first, so a server started after, in a cgroup of its own, is charged for its anon memory,
    not for the weights it maps (unless they had left the page cache)."""
    with model.open("rb") as f:
        while f.read(8 << 20):
            pass


def private_copy(model: Path, folder: Path) -> Path:
    """A copy of the model that no other process maps, out of the page cache: a page stays
    charged to the cgroup that read it first (whoever generated or served the shared file), so
    a server's cgroup would be charged nothing for the shared file's pages and could not
    thrash. (The copy's pages, written from here, are clean after the fsync and unmapped:
    POSIX_FADV_DONTNEED drops them all.) ``folder`` belongs on disk, not tmpfs."""
    copy = folder / model.name
    shutil.copyfile(model, copy)
    fd = os.open(copy, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return copy


# The words the long prompts are made of, each followed by a number: about 4.4 tokens a word in
# llama's vocabulary (80 words: ~350 tokens).
WORDS = (
    "memory", "limit", "container", "kernel", "server", "request", "model", "cache", "token",
    "slot", "wave", "prompt", "restart", "process", "reclaim", "page", "anon", "file",
)  # fmt: skip


def wave_prompt(wave: int, request: int, prefix_words: int = 30, own_words: int = 50) -> str:
    """The ``request``-th prompt of wave ``wave``: a prefix every prompt shares (a system
    prompt: ``prefix_words`` words), then words of its own (``own_words``), so no two are alike.
    A slot reuses the prefix it holds, so only the prompt's own words are computed; and since
    that prefix is less than half of what the slot holds, the server saves the slot's last
    prompt to its prompt cache before reusing it."""

    def words(rng: random.Random, n: int) -> str:
        return " ".join(f"{rng.choice(WORDS)}{rng.randrange(1000)}" for _ in range(n))

    prefix = words(random.Random(0), prefix_words)
    own = words(random.Random(f"{wave}/{request}"), own_words)
    return f"{prefix} Wave {wave}, request {request}: {own}"


@dataclass(frozen=True, slots=True)
class Wave:
    index: int  # 0 for the first
    answered: int  # requests the server answered
    failed: int  # requests that got no answer or an error
    seconds: float  # from the first request sent to the last answer


def prompt_waves(
    port: int,
    waves: int,
    after: Callable[[Wave], bool] | None = None,
    width: int = 4,
    n_predict: int = 1,
    every_s: float = WAVE_EVERY_S,
) -> list[Wave]:
    """Up to ``waves`` waves of ``width`` distinct long prompts (``wave_prompt``) sent at once,
    one every ``every_s`` seconds (or at once after the last one's answers, where they take
    longer): clients that come back, not a load test. Back to back, on a fast host, a wave is
    answered in under a second and the server's memory rises as a ramp at the 1 s a sampler
    reads it by, not in steps. The server's prompt cache is on
    (``cache_prompt``). llama-server saves a slot's prompt to its prompt cache
    (``--cache-ram``, 8 GiB by default) when the slot is reused for a prompt that shares less
    than half of it, and saves every idle slot's as a task starts: so whatever order the server
    takes a wave's tasks in, its memory grows by the last wave's prompts (two to four of them:
    the KV cache's bytes per token times their tokens) until the cache is full or the server
    is OOM-killed. ``after(wave)`` is called after each wave (to read the server's memory); the
    waves stop when it returns False or when a wave got no answer at all (the server is
    gone)."""
    done: list[Wave] = []
    start = time.monotonic()
    for w in range(waves):
        time.sleep(max(0.0, start + w * every_s - time.monotonic()))
        results: list[bool] = []

        def ask(request: int, w: int = w, results: list[bool] = results) -> None:
            try:
                complete(port, wave_prompt(w, request), n_predict, cache_prompt=True)
                results.append(True)
            except (OSError, http.client.HTTPException, ValueError):  # it died or refused
                results.append(False)

        t0 = time.monotonic()
        threads = [threading.Thread(target=ask, args=(r,)) for r in range(width)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wave = Wave(w, results.count(True), results.count(False), time.monotonic() - t0)
        done.append(wave)
        if (after is not None and not after(wave)) or not wave.answered:
            break
    return done
