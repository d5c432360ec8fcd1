"""An inference server on FastAPI + uvicorn that awaits the GPU with aiogpu.

POST /predict {"tokens": [ints]} -> {"outputs": [16 floats]}; GET /health (503 while a GPU wait
is stuck: ``aiogpu.pending_waits``); GET /stats, the last batches' sizes and waits
(``model.BatchStats``; DELETE /stats starts over). Requests are micro-batched and run on a pool
of streams over every GPU (``model.py``). ``--mode blocking`` and ``--mode to_thread`` wait the
ways aiogpu replaces, for comparison (``loadtest.py``).

Run:  python examples/serving/fastapi_server.py [--mode aiogpu] [--port 8000] [--answers-per-turn 1]
"""

# /// script
# dependencies = ["aiogpu", "fastapi", "uvicorn", "torch"]
# ///

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from model import Model, freeze_startup_objects, server_arguments
from pydantic import BaseModel

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class Prediction(BaseModel):
    tokens: list[int]


def create_app(mode: str, answers_per_turn: int = 1) -> FastAPI:
    model = Model(mode, answers_per_turn=answers_per_turn)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        freeze_startup_objects()
        print(f"serving on {model.where}, waiting with {mode}", flush=True)
        yield
        model.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/predict")
    async def predict(request: Prediction) -> dict[str, list[float]]:
        try:
            return {"outputs": await model.predict(request.tokens)}
        except ValueError as error:
            raise HTTPException(status_code=422, detail=str(error)) from None

    @app.get("/health")
    async def health() -> JSONResponse:
        healthy, body = model.health()
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.get("/stats")
    async def stats() -> dict[str, float | None]:
        return model.batches.summary()

    @app.delete("/stats")
    async def clear_stats() -> dict[str, float | None]:
        model.batches.clear()
        return model.batches.summary()

    return app


if __name__ == "__main__":
    arguments = server_arguments(__doc__.split("\n\n")[0])
    uvicorn.run(
        create_app(arguments.mode, arguments.answers_per_turn), host="127.0.0.1", port=arguments.port, log_level="warning"
    )
