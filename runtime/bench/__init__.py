"""`jmamba bench`: drive a server (or an in-process engine) with a workload and measure it.

- `workloads.py`: the sessions to run (ShareGPT-like random lengths, shared prefixes, multi-turn
  chats whose next prompt holds the previous answer); a fresh seed each run unless one is given;
- `targets.py`: where requests go (`HttpTarget`: a running `jmamba serve`; `EngineTarget`: an
  engine thread in this process) and what each one cost (`Record`);
- `runner.py`: sessions at a concurrency or a request rate;
- `report.py`: time to first token, time per output token, latency (mean, p50, p99), request and
  token throughput, as a table and as JSON.
"""
