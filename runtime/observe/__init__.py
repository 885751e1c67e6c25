"""Read-only looks at an engine: `view.py` (`EngineView`, which requests own which blocks and
slots), `step_record.py` (what each step did, copied when it ran), `step_stats.py` (what the
steps cost, host, device and compile time apart, and the features' counters), `describe.py`
(one-line descriptions of pools and schedulers)."""
