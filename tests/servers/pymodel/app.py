"""The model server's ASGI app (plain ASGI, served by uvicorn workers under gunicorn).

The model is the weights file PYMODEL_WEIGHTS, mapped read-only with numpy.memmap and read
through once by each worker before it says it is ready: ``GET /health`` answers 503 while
the weights are being mapped and touched, then 200. ``GET /generate?mib=N&tokens=K`` does K
steps of work on the weights with N MiB of working memory (anon, written, so charged), as a
request's activations and KV cache are.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import numpy as np

MiB = 1024 * 1024
DIM = 1024

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Model:
    def __init__(self) -> None:
        self.weights: np.ndarray[Any, np.dtype[np.float32]] | None = None
        self.checksum = 0.0

    def load(self) -> None:
        time.sleep(float(os.environ.get("PYMODEL_LOAD_S", "0")))
        w = np.memmap(os.environ["PYMODEL_WEIGHTS"], dtype=np.float32, mode="r")
        w = w.reshape(-1, DIM)
        # read every page: resident (and charged to this cgroup) before /health says 200
        self.checksum = float(w.sum(dtype=np.float64))
        self.weights = w

    def generate(self, mib: int, tokens: int) -> dict[str, Any]:
        w = self.weights
        assert w is not None
        work = np.empty(max(mib, 1) * MiB // 4, dtype=np.float32)
        work.fill(1.0)  # (written: np.zeros would map the zero page and charge nothing)
        x = w[0].astype(np.float64)
        rows = w.shape[0]
        out = []
        for i in range(tokens):
            row = int(abs(x[i % DIM]) * 1e6) % rows
            x = np.tanh(w[row] * x + work[i % work.size])
            out.append(row % 32000)
        return {"tokens": out, "work_mib": mib}


model = Model()


async def respond(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                # loading in the background: the worker answers /health (503) meanwhile
                threading.Thread(target=model.load, daemon=True).start()
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/health":
        if model.weights is None:
            await respond(send, 503, {"status": "loading"})
        else:
            await respond(send, 200, {"status": "ok", "pid": os.getpid()})
        return
    if path == "/generate":
        if model.weights is None:
            await respond(send, 503, {"error": "model is loading"})
            return
        q = parse_qs(scope.get("query_string", b"").decode())
        mib, tokens = int(q.get("mib", ["1"])[0]), int(q.get("tokens", ["8"])[0])
        body = await asyncio.get_running_loop().run_in_executor(None, model.generate, mib, tokens)
        await respond(send, 200, {**body, "pid": os.getpid()})
        return
    await respond(send, 404, {"error": "not found"})
