"""A step that raises (a bug, the device out of memory) retires the server's engine visibly: the
live requests get an OpenAI-style 500 naming the cause, `/health` turns 503 with it, and new
requests are refused, instead of a broken engine streaming empty answers."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

from runtime import LLM
from runtime.serve.app import build_app

MODEL = "tiny-stdlib"


def broken_step() -> list:
    raise RuntimeError("RESOURCE_EXHAUSTED: out of memory (a stand-in for the device's error)")


def wait_until(check, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(MODEL, max_num_seqs=2, max_model_len=64, prefix_caching="off")


def test_a_failed_step_fails_its_requests_and_retires_the_engine(llm, monkeypatch):
    app = build_app(llm, MODEL)
    body = {"model": MODEL, "prompt": "def ", "max_tokens": 4}
    with TestClient(app) as client:
        startup = app.state.startup
        wait_until(lambda: startup.stage == "ready")
        assert client.get("/health").status_code == 200
        monkeypatch.setattr(llm.engine, "step_deltas", broken_step)
        failed = client.post("/v1/completions", json=body)
        assert failed.status_code == 500
        assert "out of memory" in failed.json()["error"]["message"]
        health = client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "failed"
        assert "out of memory" in health.json()["error"]
        refused = client.post("/v1/completions", json=body)
        assert refused.status_code == 500
        assert "serves no more" in refused.json()["error"]["message"]
