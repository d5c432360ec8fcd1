"""A token-streaming LLM server on FastAPI + uvicorn: continuous batching, awaited with aiogpu.

POST /generate {"prompt": [token ids], "max_tokens": n} answers with server-sent events, one
``data: <token id>`` per decoded token and ``data: [DONE]`` at the end. A client that disconnects
cancels its request: its slot is free for the next step. GET /health answers from the same
event loop (``aiogpu.pending_waits`` tells it whether a GPU wait is stuck); GET /stats gives the
engine's counters. The model and the scheduler are in ``engine.py``; ``--mode`` picks how the
scheduler waits for each step (``engine.MODES``).

Run:  python examples/llm_streaming/server.py [--mode aiogpu] [--port 8000]
Load: python examples/llm_streaming/loadtest.py
"""

# /// script
# dependencies = ["aiogpu", "fastapi", "uvicorn", "torch", "transformers"]
# ///

from __future__ import annotations

import argparse
import gc
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import uvicorn
from engine import MODES, WAIT_BIN_S, Engine, ModelShape
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

import aiogpu

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

HUNG_AFTER = 10.0  # seconds a step may take before /health reports the server stuck


class Generation(BaseModel):
    prompt: list[int]
    max_tokens: int = 64


def create_app(engine: Engine) -> FastAPI:
    started = time.monotonic()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gc.collect()
        gc.freeze()  # torch, the model and the framework live as long as the server: keep full collections off them
        print(f"serving on {engine.where}, waiting with {engine.mode}", flush=True)
        yield
        engine.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/generate")
    async def generate(body: Generation) -> StreamingResponse:
        try:
            request = engine.submit(body.prompt, body.max_tokens)
        except ValueError as error:
            raise HTTPException(status_code=422, detail=str(error)) from None

        async def events() -> AsyncIterator[bytes]:
            try:
                while (token := await request.tokens.get()) is not None:
                    yield b"data: %d\n\n" % token
                yield b"data: [DONE]\n\n"
            finally:  # the client went away (the response is cancelled) or the stream ended
                engine.cancel(request)

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/health")
    async def health() -> JSONResponse:
        stuck = [wait for wait in aiogpu.pending_waits() if wait.age > HUNG_AFTER]
        body = {"status": "stuck" if stuck else "ok", "mode": engine.mode}
        return JSONResponse(body, status_code=503 if stuck else 200)

    @app.get("/stats")
    async def stats() -> dict[str, object]:
        return {
            "mode": engine.mode,
            "steps": engine.steps,
            "tokens": engine.tokens_generated,
            "waited_s": engine.waited_s,
            "host_s": engine.host_s,
            "wait_bins": engine.wait_bins,
            "wait_bin_s": WAIT_BIN_S,
            "slots_in_use": engine.slots_in_use,
            "waiting": engine.waiting,
            "uptime_s": time.monotonic() - started,
        }

    return app


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, default="aiogpu")
    parser.add_argument("--port", type=int, default=8000)
    defaults = ModelShape()
    for name in ("slots", "window", "hidden", "layers", "heads"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name), help="model shape (engine.ModelShape)")
    return parser.parse_args()


if __name__ == "__main__":
    options = arguments()
    shape = ModelShape(options.slots, options.window, options.hidden, options.layers, options.heads)
    uvicorn.run(create_app(Engine(options.mode, shape)), host="127.0.0.1", port=options.port, log_level="warning")
