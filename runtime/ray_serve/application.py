"""jmamba replicas under Ray Serve, routed by prefix: the application and the command's loop.

    HTTP -> Serve's proxy -> Ingress (1 replica: reads the body, takes its routing text)
              -> the deployment's request router picks a replica -> JmambaReplica x N
                 (each one process: `jmamba serve`'s app, model and engine thread)

Which router, and why. Ray Serve LLM's own server (`LLMServer`, `LLMConfig`, `server_cls`,
`build_openai_app`) cannot host jmamba without vLLM or SGLang: `import ray.serve.llm` raises
ImportError when neither is installed (its OpenAI protocol models are vLLM's or SGLang's, and
both bring CUDA torch); `LLMServer` and the builders that read `server_cls`
(`build_llm_deployment`, `build_openai_app`) import those models too, so a `server_cls` of ours
(as SGLang's `SGLangServer` plugs in) cannot be deployed without one of the two engines
installed. Its prefix-affinity router needs neither: `PrefixCacheAffinityRouter`
is a plain Ray Serve `RequestRouter` that keeps a prefix tree of the text it routed to each
replica (in a detached actor), sends a request to the replica whose routed text shares the
longest prefix with it (when the match covers at least 10% of the text; else to the replica
holding the least text), and falls back to power-of-two choices when queues differ by more
than `imbalanced_threshold`. It reads no engine state, so it routes any replica whose handle
calls carry a `prompt`: ours do (`forwarded.py`). We use it, imported from its module
(`ray.serve.llm.request_router`, its public name, is inside the package that needs vLLM).

What it cannot see: what a replica's cache still holds. It assumes a prefix it routed is
cached, while jmamba's prefix cache keeps a hybrid's recurrent state only at block boundaries
and evicts under pressure, so a routed prefix may be gone; the affinity is still right (no other
replica can hold it) and the cost of a wrong guess is one prefill, as with random routing. Exact
routing would read the engine's cache events (block digests and state keys published and
evicted) behind the same `RequestRouter` interface; the router here is the approximate one that
Ray Serve LLM and Dynamo also use for hybrids.

`start` deploys onto the Ray cluster this process is connected to (`ray.init()` first when it is
not: `RAY_ADDRESS`, or a new local cluster); `serve_until_stopped` is `jmamba serve
--ray-replicas N`: start, then serve until SIGTERM or Ctrl-C, then delete the application
(Serve lets the requests in flight finish first).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve
from ray.serve.deployment import Application

from runtime.ray_serve import ROUTINGS
from runtime.ray_serve.ingress import Ingress
from runtime.ray_serve.replica import JmambaReplica

POWER_OF_TWO_ROUTER = "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"
MAX_ROUTED_CHARS = 400_000  # the prefix tree's text before it evicts (Ray's default threshold)


@dataclasses.dataclass(frozen=True)
class RayServeOptions:
    """How the deployment runs.

    Attributes:
      replicas: jmamba replicas (processes), each a whole server.
      host, port: where Serve's HTTP proxy listens.
      replica_cpus, replica_gpus: what each replica reserves (with GPUs, Ray gives each replica
        its own through CUDA_VISIBLE_DEVICES).
      routing: "prefix" (prefix affinity) or "power-of-two" (Serve's default).
      imbalanced_threshold: the difference in requests in flight between replicas past which
        the prefix router balances load instead.
      max_ongoing_requests: requests in flight per replica (the rest wait in the router); the
        replica's own queue limit answers 503 beyond it.
      shutdown_seconds: how long a stopping replica waits for its requests in flight.
      app_name: the Serve application's name.
    """

    replicas: int
    host: str = "127.0.0.1"
    port: int = 8000
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    routing: str = "prefix"
    imbalanced_threshold: int = 32
    max_ongoing_requests: int = 1024
    shutdown_seconds: float = 10.0
    app_name: str = "jmamba"

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas={self.replicas} must be at least 1")
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing={self.routing!r} is not one of {ROUTINGS}")


def router_config(options: RayServeOptions) -> dict[str, Any]:
    """The replicas' request router, as Serve's `RequestRouterConfig` fields (see the module
    docstring)."""
    if options.routing == "power-of-two":
        return {"request_router_class": POWER_OF_TWO_ROUTER}
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )

    kwargs: dict[str, Any] = {
        "imbalanced_threshold": options.imbalanced_threshold,
        "do_eviction": True,  # else the tree keeps every text it ever routed
        "eviction_threshold_chars": MAX_ROUTED_CHARS,
        "eviction_target_chars": MAX_ROUTED_CHARS * 9 // 10,
    }
    return {"request_router_class": PrefixCacheAffinityRouter, "request_router_kwargs": kwargs}


def application(app_factory: Callable[[], FastAPI], options: RayServeOptions) -> Application:
    """The Serve application: the ingress bound to `options.replicas` replicas, each running
    the app `app_factory` builds (called in the replica's process)."""
    replicas = serve.deployment(
        name="jmamba-replica",
        num_replicas=options.replicas,
        ray_actor_options={"num_cpus": options.replica_cpus, "num_gpus": options.replica_gpus},
        max_ongoing_requests=options.max_ongoing_requests,
        request_router_config=router_config(options),
        graceful_shutdown_timeout_s=options.shutdown_seconds,
    )(JmambaReplica)
    ingress = serve.deployment(
        name="jmamba-ingress",
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},  # it only relays bytes
        max_ongoing_requests=options.max_ongoing_requests * options.replicas,
    )(Ingress)
    return ingress.bind(replicas.bind(app_factory))


def start(app_factory: Callable[[], FastAPI], options: RayServeOptions) -> None:
    """Deploy, and return once every replica serves (connecting to Ray first if needed)."""
    if not ray.is_initialized():
        ray.init()  # RAY_ADDRESS, or a new local cluster
    serve.start(http_options={"host": options.host, "port": options.port})
    serve.run(application(app_factory, options), name=options.app_name, route_prefix="/")


def serve_until_stopped(app_factory: Callable[[], FastAPI], options: RayServeOptions) -> int:
    """`jmamba serve --ray-replicas N`: deploy, serve until SIGTERM or Ctrl-C, then delete the
    application (its replicas finish their requests first) and disconnect."""
    start(app_factory, options)
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):  # after `ray.init`, which sets its own
        signal.signal(number, lambda *_: stop.set())
    _say(
        f"listening on http://{options.host}:{options.port}/v1: {options.replicas} replicas "
        f"under Ray Serve, {options.routing} routing (SIGTERM or Ctrl-C stops)"
    )
    while not stop.wait(timeout=1.0):
        pass
    _say("stopping: the replicas finish their requests in flight")
    serve.delete(options.app_name)
    ray.shutdown()
    return 0


def _say(message: str) -> None:
    print(f"jmamba serve: {message}", file=sys.stderr, flush=True)
