"""The variants the `profile_step` bench compares: XLA flags and allocator settings, each run in a
child process of its own (they are read when the backend starts)."""

from __future__ import annotations

import os

from benchmarks.harness.suite import repo_on_path

# name -> environment of the child process (XLA_FLAGS are appended to the caller's).
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "no_cmdbuf": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
    "cmdbuf_all": {
        "XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,"
        "CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE --xla_gpu_graph_min_graph_size=1"
    },
    # XLA turns its command buffers off while a profile is taken unless told otherwise: with this
    # flag the profile shows the step as it runs (fewer launches, shorter gaps) when graphs apply.
    "cmdbuf_prof": {"XLA_FLAGS": "--xla_enable_command_buffers_during_profiling=true"},
    # A launch probe (benchmarks/results/log/2026-11-23.md, "Command buffers and the decode
    # step's launches"): XLA's default minimum graph size left chains of fusions between other
    # kernels launched one by one (7.6 us a kernel); a minimum of 1 took 1.0 us.
    "min_graph1": {"XLA_FLAGS": "--xla_gpu_graph_min_graph_size=1"},
    # At batch 1 XLA rewrites each [1, K] x [K, N] matmul into a multiply + reduce fusion (35-45%
    # of bandwidth on the H100); a threshold of 0 may keep them GEMMs.
    "gemm_threshold0": {"XLA_FLAGS": "--xla_gpu_gemm_rewrite_size_threshold=0"},
    # The whole step is one command buffer, but the host trace showed it re-recorded
    # (`command_buffer::update`) on every call: some buffer's address moved. These try to keep
    # the addresses the graph sees still: a virtual-memory allocator, or copying moved buffers
    # into cached ones. (XLA's VA remapping flag aborted the process on the H100's jaxlib.)
    "vmm": {"XLA_PYTHON_CLIENT_ALLOCATOR": "vmm"},
    "cached_allocs": {"XLA_COMMAND_BUFFERS_USE_CACHED_ALLOCS": "1"},
    # The recorded graph's launch (cuGraphLaunch) takes 0.4-0.6 ms of host at B = 1 against 70 us
    # for a chain of as many kernels: what the step's graph has that the chain has not. Its
    # shape (XLA orders the commands as a DAG by default; SERIALIZE makes a chain), cuBLAS
    # calls recorded inside it (kept out of the graphs here), PDL between kernels.
    "sched_serialize": {"XLA_FLAGS": "--xla_gpu_command_buffer_scheduling_mode=SERIALIZE"},
    "sched_concurrent": {"XLA_FLAGS": "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT"},
    "sched_regions": {"XLA_FLAGS": "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT_REGIONS"},
    "no_cublas_graph": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL"},
    "pdl": {"XLA_FLAGS": "--xla_gpu_enable_pdl=true"},
    # The command buffer's own log: which allocations changed before each update.
    "cmdbuf_vlog": {
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "command_buffer_thunk=3,gpu_executable=3",
    },
}


def child_env(name: str, out: str) -> dict[str, str]:
    """The environment of variant `name`'s child process (the repository on its PYTHONPATH)."""
    variant = VARIANTS[name]
    flags = f"{os.environ.get('XLA_FLAGS', '')} {variant.get('XLA_FLAGS', '')}".strip()
    return repo_on_path({**os.environ, **variant, "OUT": out, "XLA_FLAGS": flags})
