"""The README's snippets run and show what its text says.

Python blocks run verbatim, in order, in one namespace (each builds on the last), from a working
directory outside the repository; the one that talks to a server (`openai.OpenAI(...)`) runs in
the server test instead. Shell blocks run through bash from the repository root with this
interpreter standing for `.venv/bin/` (the install steps before `&&` are what CI itself just ran,
and the test command is CI itself); `jmamba serve` starts in the background on a free port
(standing for the README's 8000) and the curl and client blocks run against it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.runtime.cli.test_lws import check_schemas
from tests.runtime.ray_serve.command import COMMAND as RAY_COMMAND
from tests.runtime.serve.live import free_port, wait_ready
from tests.tiers import slow, slow_cases

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
TEST_COMMAND = "scripts/venv test && .venv/bin/pytest"  # CI runs exactly this
README_PORT = "8000"


def blocks(language: str) -> list[str]:
    text = README.read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def talks_to_server(block: str) -> bool:
    """A block for the README's server: it makes the client, or uses the one made before."""
    uses_client = "openai.OpenAI(" in block or "client." in block
    return uses_client or "curl " in block or "jmamba serve" in block


def shell_commands() -> list[str]:
    """Every command line of the shell blocks (continuations joined), install steps dropped."""
    commands = []
    for block in blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and line != TEST_COMMAND:
                commands.append(re.sub(r"^scripts/venv( \w+)? && ", "", line))
    return commands


def run_shell(command: str, port: str = README_PORT) -> str:
    """`command` through bash, with this interpreter for `.venv/bin/jmamba`; its stdout."""
    command = command.replace(".venv/bin/jmamba", f'"{sys.executable}" -m runtime.cli')
    command = command.replace(f":{README_PORT}", f":{port}")
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
    return done.stdout


def test_readme_python_snippets_run(tmp_path, monkeypatch, capsys):
    local = [block for block in blocks("python") if not talks_to_server(block)]
    assert len(local) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for number, block in enumerate(local):
        exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "LLM('tiny-stdlib'" in out and "Request('0', waiting, prompt=4" in out
    assert "kv_cache_dtype=fp8, state_dtype=bfloat16)" in out  # the narrower caches' block
    assert namespace["outs"][0].finish_reason in ("length", "stop")
    assert "[('BlockStored', 'full_attention'), ('BlockStored', 'mamba')]" in out  # KV events
    assert_handed_over_tokens_are_one_engines(namespace, out)


def assert_handed_over_tokens_are_one_engines(namespace: dict, out: str) -> None:
    """The P/D block: the decode engine admitted the request and gave the 8 tokens one engine
    gives the same prompt by itself."""
    assert "['0']" in out
    one = namespace["Engine"](namespace["model"], namespace["args"])  # prefills and decodes
    one.add_request([1, 2, 3, 4, 5], namespace["SamplingParams"](max_tokens=8, ignore_eos=True))
    outputs = []
    while one.has_unfinished:
        outputs += one.step()
    (alone,) = outputs
    assert len(alone.token_ids) == 8 and str(alone.token_ids) in out
    assert namespace["handed_over"][0].token_ids == alone.token_ids


# What each `jmamba generate` command of the README must print, by a word of the command.
PROMISES = {
    '--prompt "def "': "[0] output:",
    "--prefix-caching": "prefix cache (all): 1/2 requests hit",
    "ngram": "speculative decoding (ngram)",
    "draft_model": "speculative decoding (draft_model)",
}


@pytest.mark.parametrize("word", slow_cases(sorted(PROMISES), quick=['--prompt "def "']))
def test_readme_generate_commands_do_what_the_text_says(word: str):
    matching = [c for c in shell_commands() if "jmamba generate" in c and word in c]
    assert len(matching) == 1, f"one README command with {word!r}: {matching}"
    assert PROMISES[word] in run_shell(matching[0])


@slow
def test_readme_tensor_parallel_command_gives_the_text_of_one_device():
    """The README says tokens over tensor parallelism are those of one device: the command's
    generated text equals the same command's without the flag and the fake devices."""
    (command,) = [c for c in shell_commands() if "generate --tensor-parallel-size" in c]
    alone = command.replace(" --tensor-parallel-size 2", "").split(" ", 1)[1]
    outputs = [run_shell(c) for c in (command, alone)]
    texts = [
        [line for line in out.splitlines() if line.startswith("[0] output")] for out in outputs
    ]
    assert texts[0] and texts[0] == texts[1]


@slow
def test_readme_data_parallel_command_gives_the_text_of_one_engine():
    """The README says requests over rank processes get the tokens one engine gives them: the
    command's generated texts equal the same command's without the flag."""
    (command,) = [c for c in shell_commands() if "--data-parallel-size" in c]
    alone = command.replace(" --data-parallel-size 2", "")
    outputs = [run_shell(c) for c in (command, alone)]
    texts = [[line for line in out.splitlines() if "] output" in line] for out in outputs]
    assert len(texts[0]) == 2 and texts[0] == texts[1]


def test_every_readme_shell_command_is_run_by_a_test():
    for command in shell_commands():
        covered = "jmamba serve" in command or "curl " in command
        covered |= "jmamba generate" in command and any(word in command for word in PROMISES)
        covered |= "--tensor-parallel-size" in command or "--data-parallel-size" in command
        covered |= "jmamba lws" in command  # test_readme_lws_command_prints_a_valid_manifest
        assert covered, f"no test runs the README command {command!r}"


def server_command() -> str:
    """The README's `jmamba serve` command for one server (the Ray Serve one has its test)."""
    (serve,) = [c for c in shell_commands() if "jmamba serve" in c and "--ray-replicas" not in c]
    return serve


def test_readme_ray_serve_command_is_the_one_its_test_runs():
    """tests/runtime/ray_serve/test_ray_serve.py starts exactly this command on a local Ray
    cluster (two replicas, prefix-aware routing, a replica killed)."""
    (ray,) = [c for c in shell_commands() if "--ray-replicas" in c]
    assert ray == f".venv/bin/{RAY_COMMAND}"


def test_readme_lws_command_prints_a_valid_manifest():
    """The README's `jmamba lws ... | kubectl apply -f -`, up to the pipe (no cluster here): a
    LeaderWorkerSet valid against its schema, pod templates valid against Kubernetes' own."""
    (command,) = [c for c in shell_commands() if "jmamba lws" in c]
    printed, kubectl = command.split(" | ")
    assert kubectl == "kubectl apply -f -"
    manifest = json.loads(run_shell(printed))
    check_schemas(manifest)
    assert manifest["spec"]["leaderWorkerTemplate"]["size"] == 2


@slow
def test_readme_server_blocks_answer():
    serve = server_command()
    port = str(free_port())
    argv = serve.replace(".venv/bin/jmamba", f'"{sys.executable}" -m runtime.cli')
    argv = argv.replace(f"--port {README_PORT}", f"--port {port}")
    with tempfile.TemporaryFile() as log:
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        server = subprocess.Popen(
            ["bash", "-c", f"exec {argv}"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        try:
            wait_ready(f"http://127.0.0.1:{port}", server, log)
            (curl,) = [c for c in shell_commands() if c.startswith("curl ")]
            answer = json.loads(run_shell(curl, port))
            assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] == 16
            namespace: dict = {}
            for number, block in enumerate(b for b in blocks("python") if talks_to_server(b)):
                block = block.replace(f":{README_PORT}/", f":{port}/")
                exec(compile(block, f"README.md client block {number}", "exec"), namespace)
            namespace["client"].close()  # its pooled socket, else a ResourceWarning at some gc
            assert namespace["answer"].choices[0].message.content is not None
            assert re.fullmatch(r"[a-z]{3,8}@example\.com", namespace["mail"].choices[0].text)
            assert namespace["called"].choices[0].finish_reason == "tool_calls"
            assert namespace["call"].function.name == "get_weather"
        finally:
            server.terminate()
            server.wait(timeout=30)
