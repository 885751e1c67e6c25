"""The one entry of every suite: `python -m benchmarks.<suite> BENCH [flags]` imports the suite's
module BENCH and calls its `main(flags)`; `--help` lists the benches, each with the first
paragraph of its module's docstring (read from the source: a bench imports JAX, and more)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def summary(module: str) -> str:
    """The first paragraph of `module`'s docstring, on one line, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(module)
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def usage(suite: str, benches: tuple[str, ...]) -> str:
    """The suite's help: what it measures, then one entry per bench."""
    width = max(map(len, benches))
    lines = [f"usage: python -m {suite} BENCH [that bench's flags]", ""]
    lines += [*textwrap.wrap(summary(suite), 100), "", "benches:"]
    for bench in benches:
        text = textwrap.wrap(summary(f"{suite}.{bench}"), 96 - width)
        lines.append(f"  {bench:{width}s}  {text[0] if text else ''}")
        lines += [" " * (width + 4) + more for more in text[1:]]
    lines += ["", f"`python -m {suite} BENCH --help` lists that bench's flags."]
    return "\n".join(lines)


def run_suite(suite: str, benches: tuple[str, ...], argv: list[str] | None = None) -> int:
    """Run bench `argv[0]` of `suite` with the flags after it; its exit status (0 unless its
    `main` returns an int)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(suite, benches))
        return 0 if argv else 2
    name, flags = argv[0], argv[1:]
    if name not in benches:
        print(f"{suite}: no bench {name!r}; its benches: {', '.join(benches)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{suite}.{name}")
    sys.argv = [f"python -m {suite} {name}", *flags]  # argparse's `prog` in the bench's help
    result = module.main(flags)
    return result if type(result) is int else 0


def bench_command(suite: str, bench: str, *flags: str) -> list[str]:
    """The command line that runs a bench in a child process through its suite's entry."""
    return [sys.executable, "-m", suite, bench, *flags]


def repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with the repository root first on PYTHONPATH, so a child's `-m benchmarks...`
    resolves from any working directory."""
    paths = [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}
