"""`jmamba serve`: an OpenAI-compatible HTTP server for one model (runtime/serve/).

The port is bound first, before jax loads: a port in use, a `--host` that is not this machine's
or a bad option fails at once. The server then answers from the start: 503 with `Retry-After`
(and `/health` 503, with the warm-up's progress) while the model loads and the engine thread
makes ready the step programs `--warmup` names (by default decode steps and one prefill row
alone; `all`: every program of the serving bucket table; with a bar on stderr; the step store
keeps them for the next start), 200 once they are ready.
SIGTERM (or Ctrl-C) stops taking connections, lets the requests in flight finish for up to
`--shutdown-timeout` seconds, and exits, at any stage. With `--ray-replicas N` the same app runs
in N Ray Serve replicas behind one front, routed by prefix (`ray_serve.py`, runtime/ray_serve/).
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from runtime.cli import ray_serve
from runtime.cli.engine_options import (
    HelpFormatter,
    add_engine_options,
    engine_options,
    initialize_multi_host,
)
from runtime.core.config import COMPILE_WORKERS

# `runtime.serve.tool_parsers.TOOL_PARSERS`' names, known before the server's modules load
TOOL_CALL_PARSERS = ("hermes", "none")

if TYPE_CHECKING:  # loads jax: the command imports it only once the port is bound
    from fastapi import FastAPI

    from runtime.llm import LLM

# --warmup -> Engine.warmup(prefill=)
WARMUPS: dict[str, bool | Literal["alone"]] = {"decode": False, "alone": "alone", "all": True}
API_KEY_ENV = "JMAMBA_API_KEY"  # the key when --api-key is not given


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
    serve.add_argument(
        "--port", type=_port, default=8000, help="port to listen on (0: any free one)"
    )
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
    _add_http_options(serve)
    ray_serve.add_options(serve)
    add_engine_options(serve, max_num_seqs=32, one_sampler_program=True, bucket_table="serving")
    serve.set_defaults(run=run)


def _add_http_options(serve: argparse.ArgumentParser) -> None:
    http = serve.add_argument_group("HTTP limits and access")
    http.add_argument(
        "--api-key",
        default=None,
        help=f"every /v1 route needs 'Authorization: Bearer <key>' (default: ${API_KEY_ENV} "
        "if set, else none); /health and /metrics stay open",
    )
    http.add_argument(
        "--max-request-bytes",
        type=_positive,
        default=16 * 2**20,
        help="largest request body; a larger one gets a 413",
    )
    http.add_argument(
        "--max-choices-per-request",
        type=_positive,
        default=256,
        help="most prompts x n one request may ask for; more gets a 400",
    )
    http.add_argument(
        "--max-queued-requests",
        type=_positive,
        default=1024,
        help="most choices waiting beyond those the engine runs at once (max-num-seqs per "
        "rank); a request past it gets a 503 with Retry-After",
    )
    http.add_argument(
        "--tool-call-parser",
        choices=TOOL_CALL_PARSERS,
        default="none",
        help="how chat answers are read for tool calls: hermes (Qwen's <tool_call> JSON "
        "blocks); none: tools are refused unless tool_choice is 'none'",
    )
    http.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds SIGTERM waits for the requests in flight before it cancels them",
    )


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535; 0: any)")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def run(args: argparse.Namespace, started: float) -> int:
    """Bind the port, then serve (loading and compiling meanwhile) until stopped."""
    try:
        import fastapi  # noqa: F401 (the app's, imported below once the port is bound)
        import uvicorn
    except ImportError as error:
        raise ValueError(
            f"jmamba serve needs the serve extra (pip install jmamba[serve]): {error}"
        ) from None
    if args.ray_replicas:  # Ray Serve's proxy binds the port; each replica builds this app
        return ray_serve.run(args, functools.partial(served_app, args))
    listener = _listen(args.host, args.port)
    name = args.served_model_name or args.model
    failures: list[BaseException] = []
    # `server` is made next
    app = served_app(args, started, on_failure=lambda error: _stop(server, failures, error))
    config = uvicorn.Config(
        app, log_level=args.log_level, timeout_graceful_shutdown=args.shutdown_timeout
    )
    server = uvicorn.Server(config)
    host, port = listener.getsockname()[:2]
    _say(f"listening on http://{host}:{port}/v1, loading {name} (GET /health is 200 once ready)")
    try:
        server.run(sockets=[listener])
    except KeyboardInterrupt:  # uvicorn raises Ctrl-C's signal again once it has drained
        _exit_now(130)
    if failures:
        raise failures[0]  # the load's error (a ValueError: exit 2, said in one line)
    return 0


def served_app(
    args: argparse.Namespace,
    started: float | None = None,
    on_failure: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The server's app for the options (it loads and compiles once started); `started`: when
    the command began (None: now)."""
    from runtime.serve.app import build_app  # loads jax: after the port is bound
    from runtime.serve.limits import Limits
    from runtime.serve.tool_parsers import tool_parser

    began = time.perf_counter() if started is None else started
    limits = Limits(args.max_request_bytes, args.max_choices_per_request, args.max_queued_requests)
    return build_app(
        lambda: _load(args, began),
        args.served_model_name or args.model,
        lambda llm: _compile(llm, WARMUPS[args.warmup], args.compile_workers),
        limits=limits,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        on_failure=on_failure,
        tool_parser=tool_parser(args.tool_call_parser),
    )


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port; ValueError when it cannot be (the port taken, a host that
    is not this machine's or that no resolver knows)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise ValueError(f"--host {host!r}: {error.strerror}") from None
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        listener.bind(address)
    except OSError as error:
        listener.close()
        raise ValueError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return listener


def _load(args: argparse.Namespace, started: float) -> LLM:
    """The `LLM` of the options (in the server's loading thread)."""
    from runtime.llm import LLM  # loads jax: after the port is bound

    initialize_multi_host(args)
    begun = time.perf_counter()
    llm = LLM(args.model, **engine_options(args))
    setup = llm.setup_seconds
    _say(
        f"{llm.name} loaded in {time.perf_counter() - started:.1f} s (start-up and imports "
        f"{begun - started:.1f} s, checkpoint {llm.checkpoint_seconds:.1f} s, parameters "
        f"placed {setup['parameters']:.1f} s, pools {setup['pools']:.1f} s); compiling"
    )
    return llm


def _compile(llm: LLM, warmup: bool | Literal["alone"], workers: int) -> None:
    start = time.perf_counter()
    engine = llm.engine
    possible = engine.snapshot().programs_possible
    _say(f"{possible} step programs possible ({engine.config.bucket_table} bucket table)")
    engine.warmup(prefill=warmup, sampled=True, progress=True, workers=workers)
    now = engine.snapshot()
    _say(
        f"ready, {now.num_variants} step variants ({now.num_loaded} loaded from the step "
        f"store, {now.num_compiled} compiled) of {possible} possible, in "
        f"{time.perf_counter() - start:.1f} s"
    )


def _stop(server: Any, failures: list[BaseException], error: BaseException) -> None:
    """A failed load: the server stops, and the command exits with the error."""
    failures.append(error)
    server.should_exit = True


def _say(message: str) -> None:
    print(f"jmamba serve: {message}", file=sys.stderr, flush=True)


def _exit_now(code: int) -> None:
    """Exit without joining threads: a compile under way cannot be interrupted, and the
    interpreter's exit would wait for its worker threads."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
