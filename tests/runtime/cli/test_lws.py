"""`jmamba lws`: the printed LeaderWorkerSet against the schemas, and the command each pod runs.

The pod templates are checked against Kubernetes' own OpenAPI schemas (the kubernetes-validate
package ships them; strict: no unknown field), as the PodTemplateSpec they are. No PyPI package
ships the LeaderWorkerSet CRD or an LWS client, so its own fields are checked against a schema
written here from the CRD's documented API (leaderworkerset.x-k8s.io/v1: LeaderWorkerSetSpec and
LeaderWorkerTemplate), unknown fields refused. Each pod's args, with LWS's variables substituted
as Kubernetes does, parse with the real `jmamba` parser into the multi-host run they must be.
"""

from __future__ import annotations

import json
import re

import jsonschema
import kubernetes_validate

from runtime.cli import main, parser

POD_TEMPLATE = {"type": "object"}  # checked against Kubernetes' own schema in the test
LWS_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "leaderworkerset.x-k8s.io/v1"},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["leaderWorkerTemplate"],
            "additionalProperties": False,
            "properties": {
                "replicas": {"type": "integer", "minimum": 0},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "rolloutStrategy": {"type": "object"},
                "networkConfig": {"type": "object"},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "required": ["workerTemplate"],
                    "additionalProperties": False,
                    "properties": {
                        "size": {"type": "integer", "minimum": 1},
                        "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "None"]},
                        "leaderTemplate": POD_TEMPLATE,
                        "workerTemplate": POD_TEMPLATE,
                        "subGroupPolicy": {"type": "object"},
                    },
                },
            },
        },
    },
}


def rendered(capsys, *options: str) -> dict:
    assert main(["lws", "--image", "ghcr.io/example/jmamba:1", *options]) == 0
    return json.loads(capsys.readouterr().out)


def check_schemas(manifest: dict) -> None:
    """`manifest` against the LWS schema above and its pod templates against Kubernetes' own."""
    jsonschema.validate(manifest, LWS_SCHEMA)
    group = manifest["spec"]["leaderWorkerTemplate"]
    version = kubernetes_validate.latest_version()
    for role in ("leaderTemplate", "workerTemplate"):
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": role}}
        kubernetes_validate.validate({**pod, "template": group[role]}, version, strict=True)


def expanded(args: list[str], env: dict[str, str]) -> list[str]:
    """`args` as Kubernetes expands `$(NAME)` references to the container's variables."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def test_manifest_validates_and_runs_one_jax_distributed_group(capsys):
    manifest = rendered(
        capsys,
        *("--model", "/models/qwen3-next", "--num-hosts", "3", "--gpus-per-host", "8"),
        *("--tensor-parallel-size", "4", "--", "--gpu-memory-utilization", "0.9"),
    )
    check_schemas(manifest)
    group = manifest["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 3
    addresses = []
    for index, role in ((0, "leaderTemplate"), (1, "workerTemplate"), (2, "workerTemplate")):
        (container,) = group[role]["spec"]["containers"]
        assert container["command"] == ["jmamba"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        # What LWS sets in each pod: the leader's address, the group's size, the pod's index.
        env = {"LWS_LEADER_ADDRESS": "jmamba-0.jmamba", "LWS_GROUP_SIZE": "3"}
        args = parser().parse_args(
            expanded(container["args"], {**env, "LWS_WORKER_INDEX": str(index)})
        )
        assert args.command == "serve" and args.process_id == index and args.num_processes == 3
        assert args.data_parallel_size * args.tensor_parallel_size == 3 * 8
        assert args.tensor_parallel_size == 4 and args.gpu_memory_utilization == 0.9
        addresses.append(args.coordinator_address)
    assert addresses == ["jmamba-0.jmamba:1234"] * 3  # every process joins the leader
    (leader,) = group["leaderTemplate"]["spec"]["containers"]
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}


def test_a_rank_split_over_hosts_is_refused(capsys):
    options = ["--image", "i", "--model", "m", "--gpus-per-host", "8"]
    assert main(["lws", *options, "--tensor-parallel-size", "3"]) == 2
    assert "must divide gpus_per_host=8" in capsys.readouterr().err
