"""The serving runtime: host-side bookkeeping (numpy only) around one jitted, donated model step.

The public face (`from runtime import LLM, SamplingParams`, or the same names from `jmamba`):

- `LLM`: load a model and generate for many prompts (`generate`, `stream`);
- `Engine`: one step at a time, everything inspectable;
- `EngineArgs`: what an engine is asked for (None: derived), and `EngineConfig`, what it runs
  with once `EngineArgs` are resolved for the model and the device;
- `SamplingParams`, `StructuredOutput`, `SpeculativeConfig`: what a request samples, what its
  output must match (a JSON schema, a regex, a choice, a grammar), how drafts are proposed;
- `RequestOutput`, `StreamDelta`: what comes back.

The wings, each a folder: `core/` (jax-free vocabulary and policy), `device/` (the jitted step),
`prefix_cache/`, `speculative/` and `structured/` (the features, behind seams that are always
present),
`outputs/` (text, logprobs, stream deltas), `observe/` (records, stats, views), and on top
`engine.py`, `launched_step.py`, `router.py`, `llm.py`, `cli/` (`jmamba generate`, `serve`,
`bench`), `serve/` (the HTTP server) and `bench/` (`jmamba bench`). docs/architecture.md,
section 3, maps every module.

Names load on first use (PEP 562): importing `runtime.core` does not load jax.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LLM": "runtime.llm",
    "Engine": "runtime.engine",
    "EngineArgs": "runtime.core.engine_args",
    "EngineConfig": "runtime.core.config",
    "SamplingParams": "runtime.core.sampling_params",
    "StructuredOutput": "runtime.core.structured_output",
    "SpeculativeConfig": "runtime.core.speculative_config",
    "RequestOutput": "runtime.outputs.request_output",
    "StreamDelta": "runtime.outputs.request_output",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
