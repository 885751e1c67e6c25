"""Start the rank processes: one `python -m runtime.cli.rank_process` per data-parallel rank, each
seeing only its own devices, each joined to the front by a socket pair.

A rank r of T devices (its tensor-parallel shards) gets devices r*T .. r*T + T - 1 of the front's
`CUDA_VISIBLE_DEVICES` (all GPUs when unset), and T fake CPU devices where JAX runs on the CPU.
The child's end of the socket pair is the one file descriptor it inherits besides stdio; its
stdout and stderr are the front's, so its logs and progress bars show where the user looks.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the directory holding the runtime package
CPU_DEVICES_FLAG = "--xla_force_host_platform_device_count"


@dataclasses.dataclass(frozen=True)
class RankSpec:
    """What a rank process loads: `LLM(model, dtype=, warmup=, **options)` with one rank.

    Attributes:
      rank: this rank's index, 0 .. data_parallel_size - 1.
      model / dtype / warmup: as `LLM` takes them.
      options: the other `LLM` keywords (`EngineArgs` fields), data_parallel_size 1.
    """

    rank: int
    model: str
    dtype: str
    warmup: bool | str
    options: dict[str, Any]


@dataclasses.dataclass
class RankProcess:
    """A started rank process and the front's end of its connection."""

    rank: int
    process: subprocess.Popen
    conn: Connection

    def describe_exit(self) -> str:
        """How the process ended ("still running" if it has not)."""
        code = self.process.poll()
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def rank_environment(rank: int, num_devices: int, base: dict[str, str]) -> dict[str, str]:
    """The environment of rank `rank`'s process: `base` with only its `num_devices` devices."""
    env = dict(base)
    visible = base.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(num_devices * (rank + 1))]
    mine = ids[rank * num_devices : (rank + 1) * num_devices]
    if len(mine) < num_devices:
        raise ValueError(
            f"rank {rank} needs devices {rank * num_devices}..{(rank + 1) * num_devices - 1}: "
            f"CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)}"
        )
    env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    flags = re.sub(rf"{CPU_DEVICES_FLAG}=\S+", "", base.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join([*flags, f"{CPU_DEVICES_FLAG}={num_devices}"])
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [base.get("PYTHONPATH")])])
    return env


def start_rank(spec: RankSpec, num_devices: int) -> RankProcess:
    """Start rank `spec.rank`'s process and send it its spec (it loads in the background)."""
    front, child = socket.socketpair()
    env = rank_environment(spec.rank, num_devices, dict(os.environ))
    with child:
        process = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli.rank_process", str(child.fileno())],
            env=env,
            pass_fds=[child.fileno()],
        )
    conn = Connection(front.detach())
    conn.send(spec)
    return RankProcess(spec.rank, process, conn)
