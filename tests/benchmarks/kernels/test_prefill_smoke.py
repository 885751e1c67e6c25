"""`python -m benchmarks.kernels prefill --quick` on CPU (interpret mode, tiny shapes, no anchors):
the SSD and conv paths run their first config and land close to the plain-jnp reference (GDN is left
out: its interpret-mode compile is the slowest of the three and the path is the same)."""

from benchmarks.kernels import prefill


def test_bench_prefill_quick_runs_ssd_and_conv_against_their_references():
    rows = [r for r in prefill.main(["--quick", "--ops", "ssd,conv"]) if "ours_us" in r]
    assert {r["op"] for r in rows} == {"ssd_chunk_scan", "causal_conv1d_prefill"}
    for r in rows:
        assert r["err_y"] < 5e-3 and r["err_state"] < 5e-3, r
