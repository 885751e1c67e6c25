"""`jmamba serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over one engine thread.

- `async_engine.py`: the engine thread and the per-request delta queues (`AsyncEngine`);
- `startup.py`: loading and compiling behind a server that already answers (`Startup`);
- `intake.py`: the front door, from a checked body to choices in flight (`Intake`);
- `protocol.py`: the request bodies, checked, and the `SamplingParams` they become;
- `limits.py`: request bytes, choices per request, queue room, prompt length;
- `auth.py`: `--api-key` on the `/v1` routes;
- `errors.py`: every error in OpenAI's shape;
- `streams.py`: a request's choices in flight, merged, as a response or as server-sent chunks;
- `responses.py`: the response objects and log-probabilities in OpenAI's shapes;
- `metrics.py`: `/metrics` (Prometheus);
- `app.py`: the routes (`build_app`).

Needs the `serve` extra (pip install jmamba[serve]).
"""
