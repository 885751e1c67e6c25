"""`jmamba lws`: print a Kubernetes LeaderWorkerSet that runs one multi-host tp x dp instance.

    jmamba lws --image IMAGE --model MODEL --num-hosts 2 --gpus-per-host 8 \\
        --tensor-parallel-size 4 | kubectl apply -f -

A LeaderWorkerSet (LWS, leaderworkerset.x-k8s.io/v1: llm-d's default for multi-host) starts each
group's pods together: pod 0, the leader, and num_hosts - 1 workers. Every pod runs the same
`jmamba serve` as a multi-host run takes it (runtime/cli/engine_options.py): the coordinator of
`jax.distributed.initialize` is process 0, the leader, at `LWS_LEADER_ADDRESS`, and each pod is
process `LWS_WORKER_INDEX` of `LWS_GROUP_SIZE`; LWS sets those three variables in every container
and Kubernetes substitutes their `$(NAME)` references in the container's args, so no shell or
entry script is needed. The mesh is (dp, tp) over every GPU of the group with each rank's tp
shards on one host (`runtime.device.distributed`): dp = num_hosts * gpus_per_host / tp.

The group restarts whole when one pod does (`RecreateGroupOnPodRestart`): a `jax.distributed`
group cannot take a process back. The leader's /health is its readiness probe, and its port is
the one LWS's leader service reaches. Printed as JSON (which `kubectl apply -f` reads as YAML), so
rendering needs nothing beyond the standard library; argument parsing loads no jax.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from runtime.cli.engine_options import HelpFormatter

API_VERSION = "leaderworkerset.x-k8s.io/v1"
COORDINATOR_PORT = 1234  # jax.distributed's coordinator on the leader
HTTP_PORT = 8000


def add_command(commands: argparse._SubParsersAction) -> None:
    """Register `jmamba lws` and its options."""
    lws = commands.add_parser(
        "lws",
        help="print a Kubernetes LeaderWorkerSet for one multi-host instance",
        formatter_class=HelpFormatter,
        description="A LeaderWorkerSet (JSON) whose groups run `jmamba serve` as one "
        "jax.distributed group over num-hosts pods. Engine options for `jmamba serve` go "
        "after `--`.",
    )
    lws.add_argument("--name", default="jmamba", help="the LeaderWorkerSet's name")
    lws.add_argument("--image", required=True, help="a container image with jmamba[gpu,serve]")
    lws.add_argument("--model", required=True, help="the model `jmamba serve` loads")
    lws.add_argument("--replicas", type=int, default=1, help="instances (groups)")
    lws.add_argument("--num-hosts", type=int, default=2, help="pods (processes) per instance")
    lws.add_argument("--gpus-per-host", type=int, default=8, help="GPUs of each pod")
    lws.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs of each rank")
    lws.add_argument("--port", type=int, default=HTTP_PORT, help="the HTTP port")
    lws.add_argument("serve_options", nargs=argparse.REMAINDER, help="-- then serve options")
    lws.set_defaults(run=run)


def run(args: argparse.Namespace, started: float) -> int:
    """Print the manifest the options describe."""
    extra = args.serve_options[1:] if args.serve_options[:1] == ["--"] else args.serve_options
    manifest = leader_worker_set(
        args.name,
        args.image,
        args.model,
        replicas=args.replicas,
        num_hosts=args.num_hosts,
        gpus_per_host=args.gpus_per_host,
        tensor_parallel_size=args.tensor_parallel_size,
        port=args.port,
        serve_options=extra,
    )
    print(json.dumps(manifest, indent=2))
    return 0


def leader_worker_set(
    name: str,
    image: str,
    model: str,
    *,
    replicas: int = 1,
    num_hosts: int = 2,
    gpus_per_host: int = 8,
    tensor_parallel_size: int = 1,
    port: int = HTTP_PORT,
    serve_options: list[str] | None = None,
) -> dict[str, Any]:
    """The LeaderWorkerSet of `replicas` instances of `num_hosts` pods (module docstring).
    ValueError unless the ranks' tp shards fit on one host."""
    for field, value in (("replicas", replicas), ("num_hosts", num_hosts)):
        if value < 1:
            raise ValueError(f"{field}={value} must be >= 1")
    if tensor_parallel_size < 1 or gpus_per_host % tensor_parallel_size:
        raise ValueError(
            f"tensor_parallel_size={tensor_parallel_size} must divide gpus_per_host="
            f"{gpus_per_host}: a rank's shards are on one host"
        )
    dp = num_hosts * gpus_per_host // tensor_parallel_size
    args = serve_args(model, dp, tensor_parallel_size, port, serve_options or [])
    leader = pod_template(name, image, args, gpus_per_host, port, leader=True)
    worker = pod_template(name, image, args, gpus_per_host, port, leader=False)
    return {
        "apiVersion": API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",  # workers wait on the coordinator themselves
            "leaderWorkerTemplate": {
                "size": num_hosts,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def serve_args(model: str, dp: int, tp: int, port: int, extra: list[str]) -> list[str]:
    """`jmamba serve`'s arguments in every pod: the multi-host options from LWS's variables."""
    return [
        "serve",
        "--model",
        model,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--data-parallel-size",
        str(dp),
        "--tensor-parallel-size",
        str(tp),
        "--coordinator-address",
        f"$(LWS_LEADER_ADDRESS):{COORDINATOR_PORT}",
        "--num-processes",
        "$(LWS_GROUP_SIZE)",
        "--process-id",
        "$(LWS_WORKER_INDEX)",
        *extra,
    ]


def pod_template(
    name: str, image: str, args: list[str], gpus: int, port: int, *, leader: bool
) -> dict[str, Any]:
    """A pod template of the group: the leader's serves the port and answers /health."""
    container: dict[str, Any] = {
        "name": "jmamba",
        "image": image,
        "command": ["jmamba"],
        "args": args,
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}],  # logs as they come
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
        "ports": [{"name": "coordinator", "containerPort": COORDINATOR_PORT}],
    }
    if leader:
        container["ports"].append({"name": "http", "containerPort": port})
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": 10,
            "failureThreshold": 3,
        }
    role = "leader" if leader else "worker"
    return {
        "metadata": {"labels": {"app": name, "role": role}},
        "spec": {"containers": [container]},
    }
