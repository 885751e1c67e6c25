"""`jmamba serve`: an OpenAI-compatible HTTP server for one model (runtime/serve/).

The model loads first; the server then listens at once and answers `/health` 503 while the
engine thread compiles the step variants a server needs from the start (decode steps and one
prefill row alone; with a bar on stderr; JAX's persistent compilation cache keeps them for the next
start), 200 once they are compiled.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Literal

from runtime.cli.engine_options import (
    HelpFormatter,
    add_engine_options,
    engine_options,
    initialize_multi_host,
)
from runtime.core.config import COMPILE_WORKERS

# --warmup -> Engine.warmup(prefill=)
WARMUPS: dict[str, bool | Literal["alone"]] = {"decode": False, "alone": "alone", "all": True}


def add_command(commands: argparse._SubParsersAction) -> None:
    """Register `jmamba serve` and its options."""
    serve = commands.add_parser(
        "serve",
        help="serve a model over HTTP with the OpenAI API",
        formatter_class=HelpFormatter,
        description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, "
        "/v1/models, /health, /metrics) for a preset, a Hugging Face checkpoint directory or a "
        "hub id (org/name). "
        "Needs the serve extra (pip install jmamba[serve]).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on")
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients send (default: --model)",
    )
    serve.add_argument(
        "--warmup",
        choices=sorted(WARMUPS),
        default="alone",
        help="step variants compiled before /health says ready: decode steps, also one "
        "prefill row alone (a request arriving at an idle server), or every variant",
    )
    serve.add_argument(
        "--compile-workers",
        type=int,
        default=COMPILE_WORKERS,
        help="step variants the warm-up compiles at once",
    )
    serve.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level",
    )
    add_engine_options(serve, max_num_seqs=32)
    serve.set_defaults(run=run)


def run(args: argparse.Namespace, started: float) -> int:
    """Load the model, then serve until interrupted."""
    try:
        import uvicorn

        from runtime.serve.app import build_app
    except ImportError as error:
        raise ValueError(
            f"jmamba serve needs the serve extra (pip install jmamba[serve]): {error}"
        ) from None
    from runtime.llm import LLM  # loads jax: after the arguments are known to be good

    initialize_multi_host(args)
    llm = LLM(args.model, **engine_options(args))
    name = args.served_model_name or args.model
    warmup = WARMUPS[args.warmup]
    app = build_app(llm, name, startup=lambda: _compile(llm, warmup, args.compile_workers))
    loaded = time.perf_counter() - started
    print(
        f"jmamba serve: {name} loaded in {loaded:.1f} s; http://{args.host}:{args.port}/v1 "
        "(GET /health is 200 once the step variants are compiled)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _compile(llm, warmup: bool | Literal["alone"], workers: int) -> None:
    start = time.perf_counter()
    llm.engine.warmup(prefill=warmup, sampled=True, progress=True, workers=workers)
    print(
        f"jmamba serve: ready, {llm.engine.num_variants} step variants compiled in "
        f"{time.perf_counter() - start:.1f} s",
        file=sys.stderr,
        flush=True,
    )
