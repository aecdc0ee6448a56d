"""llama-server started as this process's child and kept busy, for a recording of the whole
(bench/eta_traces.py records it under a memory limit):

    python -m llm.load KIND SECONDS BINARY MODEL

KIND ``waves``: the prompt cache's waves (``server.prompt_waves`` on a server started with
``server.PROMPT_CACHE_ARGS``), paced as clients that come back, until the server dies or SECONDS
have passed. KIND ``steady``: one client asking for 16 tokens at a time over ``server.PROMPTS``,
one request after the other, for SECONDS. Then the server, if still running, is stopped
(SIGTERM) and waited for."""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
from pathlib import Path

from llm.server import (
    PROMPT_CACHE_ARGS,
    PROMPTS,
    argv,
    complete,
    free_port,
    prompt_waves,
    wait_healthy,
)

KINDS = {"waves": PROMPT_CACHE_ARGS, "steady": ()}


def steady(port: int, until: float, alive: subprocess.Popen[bytes]) -> None:
    i = 0
    while time.monotonic() < until and alive.poll() is None:
        try:
            complete(port, PROMPTS[i % len(PROMPTS)], 16)
        except (OSError, http.client.HTTPException, ValueError):
            time.sleep(0.2)  # a request that timed out or failed: the next one
        i += 1


def main(args: list[str]) -> int:
    kind, seconds, binary, model = args[0], float(args[1]), Path(args[2]), Path(args[3])
    port = free_port()
    server = subprocess.Popen(
        argv(binary, model, port, *KINDS[kind]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(port, 120, alive=lambda: server.poll() is None)
        until = time.monotonic() + seconds
        if kind == "waves":
            prompt_waves(port, 1000, after=lambda _: time.monotonic() < until)
        else:
            steady(port, until, server)
    finally:
        if server.poll() is None:
            server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
