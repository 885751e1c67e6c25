"""`python -m benchmarks.speculation spec_decode` on CPU with the tiny model: every kind of method
runs, the upper-bound rows accept every draft, a serve of more requests than the batch size serves
them in waves, and the JSON lands in $OUT; `--batch-invariant` runs the fixed-tile products (their
reference on the CPU)."""

from __future__ import annotations

import json

from benchmarks.speculation import spec_decode


def test_tiny_run_reports_every_method(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    methods = "none,ngram-2,oracle-2,self-2"
    argv = [
        "--size",
        "tiny",
        "--batches",
        "1",  # several batch sizes: the asynchronous run below
        "--methods",
        methods,
        "--phrase-len",
        "8",
        "--repeats",
        "4",
        "--max-tokens",
        "8",
        "--budget",
        "64",
        "--rounds",
        "1",
        "--requests",
        "2",  # two waves of one request each
        "--batch-invariant",
    ]
    rows = spec_decode.main(argv)
    assert {(r["method"], r["batch"]) for r in rows} == {
        (m, 1) for m in ("none", "ngram-2", "oracle-2", "self-2")
    }
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["compile_in_timing_s"] == 0
        assert r["decode_tokens"] == 2 * (8 - 1)  # each wave's first token is its prefill's
        if r["method"] in ("oracle-2", "self-2"):  # draft = the target's own greedy tokens
            assert r["drafted"] > 0 and r["accepted"] == r["drafted"]
    saved = json.loads((tmp_path / "bench_spec_decode.json").read_text())
    assert len(saved["rows"]) == len(rows)


def test_async_run_drafts_only_at_small_batches(monkeypatch, tmp_path):
    """--async-scheduling with `oracle-2@1`: at B = 1 it drafts (synchronous steps) and every
    draft is accepted, at B = 2 no step drafts (asynchronous steps); the baseline runs
    asynchronously too. `oracle-2@auto` (the measured gate) runs, and its drafts are right."""
    monkeypatch.setenv("OUT", str(tmp_path))
    methods = "none,oracle-2@1,oracle-2@auto"
    argv = ["--size", "tiny", "--batches", "1,2", "--methods", methods, "--rounds", "2"]
    argv += ["--phrase-len", "8", "--repeats", "4", "--max-tokens", "8", "--budget", "64"]
    argv += ["--requests", "1"]  # one wave at each batch size
    rows = spec_decode.main([*argv, "--async-scheduling"])
    limited = {r["batch"]: r for r in rows if r["method"] == "oracle-2@1"}
    assert limited[1]["drafted"] > 0 and limited[1]["accepted"] == limited[1]["drafted"]
    assert limited[2]["drafted"] == 0
    assert limited[2]["drafting_steps"] <= 1  # the first, before a request runs
    assert 0 < limited[1]["drafting_steps"] <= limited[1]["steps"]
    for row in (r for r in rows if r["method"] == "oracle-2@auto"):
        assert row["accepted"] == row["drafted"] and len(row["rounds"]) == 2
