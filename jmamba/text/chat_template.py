"""A checkpoint's chat template: how a conversation becomes one prompt text.

Hugging Face checkpoints carry a Jinja template, in `chat_template.jinja` or as the
`chat_template` field of `tokenizer_config.json` (a string, or a list of named templates of
which "default" is used); `tokenizer_config.json` also names the `bos_token` and `eos_token` the
template may print. It is rendered the way transformers renders it: a sandboxed Jinja
environment with `trim_blocks` and `lstrip_blocks`, the loop-control extension, the variables
`messages` ([{"role", "content"}]), `add_generation_prompt`, `bos_token` and `eos_token`, and a
`raise_exception(message)` a template calls to refuse a conversation (a `ValueError` here).
The built-in presets ship `presets/chat_template.jinja`, a plain one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The presets' template, a data file of jmamba/presets/ (read as a file: importing the presets
# package from here would point an import up a floor).
PRESET_TEMPLATE = Path(__file__).parents[1] / "presets" / "chat_template.jinja"


class ChatTemplate:
    """A compiled chat template and the special tokens it may print."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.globals["raise_exception"] = _refuse
        try:
            self._template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(f"the chat template does not parse: {error}") from None
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text of `messages`, ending with the assistant's turn opened (unless
        `add_generation_prompt` is False); `tools` (OpenAI's function specs) go to the template
        as `tools`, as Qwen's and Nemotron's templates read them. ValueError when the template
        refuses them."""
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.TemplateError as error:
            raise ValueError(f"the chat template failed on these messages: {error}") from None


def load_chat_template(model_dir: Path | None) -> ChatTemplate | None:
    """The chat template of a checkpoint directory (None when it has none); the presets' own
    template for `model_dir` None (a random-weight preset) or a preset directory without one."""
    if model_dir is None:
        return ChatTemplate(PRESET_TEMPLATE.read_text())
    config = _read_json(model_dir / "tokenizer_config.json")
    tokens = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}
    source = _template_source(model_dir, config)
    if source is None:
        if model_dir.parent == PRESET_TEMPLATE.parent:  # a trained preset
            return ChatTemplate(PRESET_TEMPLATE.read_text())
        return None
    return ChatTemplate(source, **tokens)


def _template_source(model_dir: Path, config: dict[str, Any]) -> str | None:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None


def _token_text(token: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(token, dict):
        return str(token.get("content", ""))
    return "" if token is None else str(token)


def _refuse(message: str) -> None:
    raise ValueError(f"the chat template refused the conversation: {message}")
