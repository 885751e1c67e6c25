"""The anchors' side of the kernel benches: mamba_ssm's Triton ops imported from its source tree
(`.whl_mamba/src`, git-ignored, carried to the device), and torch timings replayed from a
CUDA graph through `triton.testing.do_bench` (L2 flushed between reps)."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from typing import Any

from benchmarks.harness.suite import REPO_ROOT


def import_anchors() -> tuple[Any, Any, Callable, Callable]:
    """(torch, triton, mamba_ssm's `selective_state_update`, its `mamba_chunk_scan_combined`)."""
    import torch
    import triton

    src = os.path.join(REPO_ROOT, ".whl_mamba", "src")
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [os.path.join(src, "mamba_ssm")]
    sys.modules["mamba_ssm"] = pkg  # skip mamba_ssm/__init__ (it imports the CUDA extension)
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return torch, triton, selective_state_update, mamba_chunk_scan_combined


def bench_graph(torch: Any, triton: Any, fn: Callable[[], Any]) -> float:
    """Median microseconds of fn replayed from a CUDA graph (L2 flushed by do_bench)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=50, rep=300, return_mode="median") * 1e3
