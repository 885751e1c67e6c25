"""The README's Python snippets run verbatim, in order, in one namespace (each builds on the
last), from a working directory outside the repository. Their `max_tokens` are already small."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_readme_python_snippets_run(tmp_path, monkeypatch, capsys):
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for number, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "LLM('tiny-stdlib'" in out and "Request('0', waiting, prompt=4" in out
    assert namespace["outs"][0].finish_reason in ("length", "stop")
