"""A process per data-parallel rank: the front process routes, each rank process steps.

With `data_parallel_size` D > 1, `LLM` (and the `jmamba generate` / `jmamba serve` commands built
on it) starts D rank processes (`launch.py`), each a whole one-rank engine on its own devices
(the process: `runtime/cli/rank_process.py`; its loop: `worker.py`), and keeps only the front
here: checking and routing requests, reading their outputs (`group.py`). The ranks share nothing
(a request's blocks and state slot live on its rank; expert and tensor parallelism stay inside a
rank), so they need no collective and no lockstep: each rank process schedules, builds,
dispatches and retires its own steps as fast as its devices allow, and an idle rank runs nothing
at all. The one-program mesh over ranks (`Engine` with `data_parallel_size` > 1 in one process)
stays for multi-host runs and for looking inside.

    front process                          rank process r (one per rank, `python -m
      RankGroup: check, route (least         runtime.cli.rank_process`): LLM(dp = 1) on its
      outstanding tokens), read outputs  <-> devices, `RankLoop`: take messages, step, send
      over one local connection per rank     each step's finished outputs or stream deltas
"""
