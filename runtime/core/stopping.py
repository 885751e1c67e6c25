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
    num_tokens = len(request.prompt_token_ids) + num_outputs  # request.num_tokens, inlined
    if num_outputs >= params.max_tokens or num_tokens >= config.max_model_len:
        return FinishReason.LENGTH
    return None


def append_tokens(request: Request, tokens: list[int], config: EngineConfig) -> FinishReason | None:
    """Append `tokens` to the request's output up to the first that stops it; returns why it
    stops (None: it goes on)."""
    outputs, stop_ids = request.output_token_ids, request.stop_ids
    end = len(outputs) + len(tokens)
    if (  # none of them can stop it (the usual row): all at once
        end < request.sampling_params.max_tokens
        and len(request.prompt_token_ids) + end < config.max_model_len
        and not any(token in stop_ids for token in tokens)
    ):
        outputs.extend(map(int, tokens))
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
    num_outputs = request.num_sampled
    num_tokens = len(request.prompt_token_ids) + num_outputs
    return num_outputs >= request.sampling_params.max_tokens or num_tokens >= config.max_model_len
