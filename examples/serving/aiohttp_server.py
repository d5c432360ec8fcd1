"""The same inference server on aiohttp's web server, awaiting the GPU with aiogpu.

POST /predict {"tokens": [ints]} -> {"outputs": [16 floats]}; GET /health (503 while a GPU wait
is stuck); GET /stats, the last batches' sizes and waits (DELETE /stats starts over). See
``model.py``.

Run:  python examples/serving/aiohttp_server.py [--mode aiogpu] [--port 8000] [--answers-per-turn 1]
"""

# /// script
# dependencies = ["aiogpu", "aiohttp", "torch"]
# ///

from __future__ import annotations

from aiohttp import web
from model import Model, freeze_startup_objects, server_arguments

MODEL = web.AppKey("model", Model)


async def predict(request: web.Request) -> web.Response:
    body = await request.json()
    tokens = body.get("tokens") if isinstance(body, dict) else None
    if not isinstance(tokens, list):
        raise web.HTTPUnprocessableEntity(text='expected {"tokens": [ints]}')
    try:
        outputs = await request.app[MODEL].predict(tokens)
    except ValueError as error:
        raise web.HTTPUnprocessableEntity(text=str(error)) from None
    return web.json_response({"outputs": outputs})


async def health(request: web.Request) -> web.Response:
    healthy, body = request.app[MODEL].health()
    return web.json_response(body, status=200 if healthy else 503)


async def stats(request: web.Request) -> web.Response:
    batches = request.app[MODEL].batches
    if request.method == "DELETE":
        batches.clear()
    return web.json_response(batches.summary())


def create_app(mode: str, answers_per_turn: int = 1) -> web.Application:
    app = web.Application()
    app[MODEL] = model = Model(mode, answers_per_turn=answers_per_turn)
    app.router.add_post("/predict", predict)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_delete("/stats", stats)

    async def announce(app: web.Application) -> None:
        freeze_startup_objects()
        print(f"serving on {model.where}, waiting with {mode}", flush=True)

    async def close(app: web.Application) -> None:
        model.close()

    app.on_startup.append(announce)
    app.on_cleanup.append(close)
    return app


if __name__ == "__main__":
    arguments = server_arguments(__doc__.split("\n\n")[0])
    web.run_app(create_app(arguments.mode, arguments.answers_per_turn), host="127.0.0.1", port=arguments.port, print=None)
