"""`jmamba serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over one engine thread.

- `async_engine.py`: the engine thread and the per-request delta queues (`AsyncEngine`);
- `protocol.py`: the request bodies, checked, and the `SamplingParams` they become;
- `streams.py`: a request's choices in flight, merged, as a response or as server-sent chunks;
- `responses.py`: the response objects and log-probabilities in OpenAI's shapes;
- `metrics.py`: `/metrics` (Prometheus);
- `app.py`: the routes (`build_app`).

Needs the `serve` extra (`pip install jmamba[serve]`).
"""
