"""`jmamba serve --ray-replicas N`: the server's options for Ray Serve, and the run that hands
the server's app to `runtime.ray_serve` (N replicas behind one HTTP front, routed by prefix).

Registering the options imports no Ray (argument errors answer at once); the run imports it
and says which extra to install when it is missing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.ray_serve import ROUTINGS

if TYPE_CHECKING:  # Ray: imported by the run only
    from fastapi import FastAPI

    from runtime.ray_serve.application import RayServeOptions


def add_options(serve: argparse.ArgumentParser) -> None:
    """Register `jmamba serve`'s `--ray-*` options."""
    ray = serve.add_argument_group("Ray Serve (pip install 'jmamba[ray]')")
    ray.add_argument(
        "--ray-replicas",
        type=int,
        default=0,
        help="serve N replicas of this server under Ray Serve, each its own process, behind one "
        "HTTP front on --host:--port, on the Ray cluster RAY_ADDRESS names (else a new local "
        "one); 0: one server in this process",
    )
    ray.add_argument(
        "--ray-routing",
        choices=ROUTINGS,
        default=ROUTINGS[0],
        help="prefix: each request to the replica that was sent its longest prefix (Ray Serve "
        "LLM's PrefixCacheAffinityRouter); power-of-two: Serve's default, by load alone",
    )
    ray.add_argument(
        "--ray-replica-cpus", type=float, default=1.0, help="CPUs each replica reserves"
    )
    ray.add_argument(
        "--ray-replica-gpus",
        type=float,
        default=0.0,
        help="GPUs each replica reserves (Ray gives each replica its own)",
    )


def run(args: argparse.Namespace, app_factory: Callable[[], FastAPI]) -> int:
    """Serve `app_factory`'s app in `--ray-replicas` replicas until SIGTERM or Ctrl-C."""
    try:
        from runtime.ray_serve.application import serve_until_stopped
    except ImportError as error:
        raise ValueError(
            f"--ray-replicas needs the ray extra (pip install 'jmamba[ray]'): {error}"
        ) from None
    return serve_until_stopped(app_factory, options(args))


def options(args: argparse.Namespace) -> RayServeOptions:
    """The deployment's options from the command's: the prefix router balances load once
    replicas differ by a batch (`--max-num-seqs`) of requests in flight, and a replica takes
    as many as its engine runs and queues."""
    from runtime.ray_serve.application import RayServeOptions

    return RayServeOptions(
        replicas=args.ray_replicas,
        host=args.host,
        port=args.port,
        replica_cpus=args.ray_replica_cpus,
        replica_gpus=args.ray_replica_gpus,
        routing=args.ray_routing,
        imbalanced_threshold=args.max_num_seqs,
        max_ongoing_requests=args.max_num_seqs + args.max_queued_requests,
        shutdown_seconds=args.shutdown_timeout,
    )
