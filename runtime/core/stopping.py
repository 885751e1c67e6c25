"""When a request stops: a stop token past `min_tokens`, `max_tokens` outputs, or prompt + output
reaching `max_model_len` (no jax). Stop strings are text, decided in the outputs wing."""

from __future__ import annotations

from runtime.core.config import EngineConfig
from runtime.core.request import FinishReason, Request


def stop_reason(request: Request, token: int, config: EngineConfig) -> FinishReason | None:
    """Why `request` stops after its newest output `token` (appended already); None: it goes
    on."""
    params = request.sampling_params
    num_outputs = len(request.output_token_ids)  # `token` included
    if token in request.stop_ids and num_outputs > params.min_tokens:
        return FinishReason.STOP
    if reaches_length(request, num_outputs, config):
        return FinishReason.LENGTH
    return None


def reaches_length(request: Request, num_outputs: int, config: EngineConfig) -> bool:
    """Whether `num_outputs` outputs reach the request's `max_tokens`, or with its prompt the
    engine's `max_model_len` (the one length rule: counts alone, no token needed)."""
    num_tokens = len(request.prompt_token_ids) + num_outputs  # request.num_tokens, inlined
    return num_outputs >= request.sampling_params.max_tokens or num_tokens >= config.max_model_len


def append_tokens(request: Request, tokens: list[int], config: EngineConfig) -> FinishReason | None:
    """Append `tokens` to the request's output up to the first that stops it; returns why it
    stops (None: it goes on)."""
    outputs, stop_ids = request.output_token_ids, request.stop_ids
    end = len(outputs) + len(tokens)  # the counts only grow: the last token reaches length first
    if not reaches_length(request, end, config) and not any(t in stop_ids for t in tokens):
        outputs.extend(map(int, tokens))  # none of them can stop it (the usual row): at once
        return None
    for token in map(int, tokens):
        outputs.append(token)
        reason = stop_reason(request, token, config)
        if reason is not None:
            return reason
    return None


def ends_with_pending(request: Request, config: EngineConfig) -> bool:
    """Whether the pending token reaches max_tokens or max_model_len (counts, known before the
    token itself arrives)."""
    return reaches_length(request, request.num_sampled, config)
