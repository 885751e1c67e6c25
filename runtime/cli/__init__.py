"""The `jmamba` command: `generate` (prompts from the command line), `serve` (an OpenAI-compatible
HTTP server), `bench` (a serving benchmark) and `lws` (a Kubernetes LeaderWorkerSet for one
multi-host instance). Each command is a module here that registers its options (`add_command`)
and runs (`run`); the engine options they share are in `engine_options.py`. Argument parsing
loads no jax, so `--help` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from runtime.cli import bench, generate, lws, serve


def parser() -> argparse.ArgumentParser:
    """The `jmamba` argument parser, every command registered."""
    top = argparse.ArgumentParser(prog="jmamba")
    commands = top.add_subparsers(dest="command", required=True)
    for command in (generate, serve, bench, lws):
        command.add_command(commands)
    return top


def show_info_logs() -> None:
    """Send the INFO lines of jmamba's own loggers (`jmamba.*`, `runtime.*`: the pool sizing at
    start-up, skipped checkpoint tensors) to stderr, once; other libraries' stay at their level."""
    for name in ("jmamba", "runtime"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("jmamba: %(message)s"))
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Run a `jmamba` command; a bad argument or input is one line on stderr and exit code 2."""
    started = time.perf_counter()
    args = parser().parse_args(argv)
    show_info_logs()
    try:
        return args.run(args, started)
    except ValueError as error:
        print(f"jmamba: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
