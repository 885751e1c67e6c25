"""`jmamba generate`: generate from the command line (default: the trained `tiny-stdlib` preset).

Prints, per prompt, the prompt and output text (or token ids without a tokenizer), the number of
tokens, the finish reason and the time to first token; then the model, where the time went
(import, load, compile, run) and the generation speed with compile time excluded.
"""

from __future__ import annotations

import argparse
import time

from runtime.cli.engine_options import (
    HelpFormatter,
    add_engine_options,
    engine_options,
    initialize_multi_host,
)
from runtime.core.sampling_params import MAX_LOGPROBS, SamplingParams

DEFAULT_TEXT_PROMPT = "def "


def add_command(commands: argparse._SubParsersAction) -> None:
    """Register `jmamba generate` and its options."""
    gen = commands.add_parser(
        "generate",
        help="generate text for one or more prompts",
        formatter_class=HelpFormatter,
        description="Generate with a built-in preset, a Hugging Face checkpoint directory "
        "(config.json + *.safetensors [+ tokenizer.json]) or a Hugging Face hub id (org/name, "
        "downloaded into huggingface_hub's cache; offline with HF_HUB_OFFLINE=1). Without "
        f"--prompt or --prompt-ids the prompt is {DEFAULT_TEXT_PROMPT!r}.",
    )
    gen.add_argument(
        "--prompt",
        action="append",
        help=f"text prompt, repeat for several (default: {DEFAULT_TEXT_PROMPT!r} without "
        "--prompt-ids)",
    )
    gen.add_argument(
        "--prompt-ids", action="append", help="comma-separated token ids, repeat for several"
    )
    sampling = gen.add_argument_group("sampling (every prompt)")
    sampling.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    sampling.add_argument(
        "--min-tokens", type=int, default=0, help="no stop token before this many"
    )
    sampling.add_argument("--ignore-eos", action="store_true", help="do not stop at the EOS ids")
    sampling.add_argument("--stop", action="append", help="stop string, repeat for several")
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    sampling.add_argument("--top-k", type=int, default=0, help="0 = no limit")
    sampling.add_argument("--top-p", type=float, default=1.0, help="1 = no limit")
    sampling.add_argument(
        "--seed", type=int, default=None, help="seed of every prompt's sampling (default: derived)"
    )
    sampling.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        help="minus this for each token already output",
    )
    sampling.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="minus this times how often each token was output",
    )
    sampling.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="divide (positive) or multiply (negative) the logits of prompt and output tokens",
    )
    sampling.add_argument(
        "--logprobs",
        type=int,
        default=None,
        help=f"print top-k log-probabilities, k <= {MAX_LOGPROBS} (default: none)",
    )
    add_engine_options(gen)
    gen.set_defaults(run=run)


def run(args: argparse.Namespace, started: float) -> int:
    """Generate for the prompts; print each output and where the time went."""
    prompts, params = _prompts(args), _sampling_params(args)
    from runtime.llm import LLM  # loads jax: after the arguments are known to be good

    imported = time.perf_counter()
    initialize_multi_host(args)
    llm = LLM(args.model, **engine_options(args))
    if not prompts:
        prompts = [DEFAULT_TEXT_PROMPT] if llm.tokenizer is not None else [[1, 2, 3, 4]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, output in zip(prompts, outputs, strict=True):
        _print_output(prompt, output, llm.tokenizer)
    _print_summary(llm, outputs, import_seconds=imported - started)
    return 0


def _prompts(args: argparse.Namespace) -> list:
    prompts: list = list(args.prompt or [])
    for text in args.prompt_ids or []:
        try:
            prompts.append([int(t) for t in text.split(",") if t.strip()])
        except ValueError:
            raise ValueError(f"--prompt-ids {text!r} must be comma-separated ints") from None
    return prompts


def _sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        min_tokens=args.min_tokens,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        stop=tuple(args.stop or ()),
        logprobs=args.logprobs,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
    )


def _print_output(prompt, output, tokenizer) -> None:
    rid = output.request_id
    shown_prompt = repr(prompt) if isinstance(prompt, str) else prompt
    shown_output = repr(output.text) if output.text is not None else output.token_ids
    ttft = output.time_to_first_token
    ttft_text = "-" if ttft is None else f"{ttft:.3f} s (compile included)"
    print(f"[{rid}] prompt: {shown_prompt}")
    print(f"[{rid}] output: {shown_output}")
    print(
        f"[{rid}] {len(output.token_ids)} tokens, finish reason: {output.finish_reason}, "
        f"time to first token: {ttft_text}"
    )
    for i, entry in enumerate(output.logprobs or []):
        shown = [f"{_token_text(token, tokenizer)}: {value:.3f}" for token, value in entry.items()]
        print(f"[{rid}]   logprobs of token {i}: {', '.join(shown)}")


def _token_text(token: int, tokenizer) -> str:
    if tokenizer is None:
        return str(token)
    return f"{token} {tokenizer.decode([token], skip_special_tokens=False)!r}"


def _print_summary(llm, outputs, import_seconds: float) -> None:
    engine, stats = llm.engine, llm.engine.stats
    tokenizer = "no tokenizer" if llm.tokenizer is None else "tokenizer.json"
    summary = llm.summary
    size = f"{summary.num_params / 1e6:.2f}M params"
    print(
        f"model: {llm.name} ({summary.architecture}, {size}, {summary.dtype}, "
        f"{tokenizer}; {engine.config.cache_dtypes.describe()})"
    )
    run = stats.host_seconds + stats.device_seconds
    print(
        f"time: import {import_seconds:.2f} s, load {llm.load_seconds:.2f} s, "
        f"compile {stats.compile_seconds:.2f} s ({engine.num_variants} step variants), "
        f"run {run:.2f} s ({stats.num_steps} steps: host {stats.host_seconds:.2f} s, "
        f"device {stats.device_seconds:.2f} s)"
    )
    generated = sum(len(output.token_ids) for output in outputs)
    speed = f"{generated / run:.1f} tokens/s" if run > 0 else "-"
    print(
        f"speed: {generated} tokens generated in {run:.2f} s of run time = {speed} "
        f"(compile excluded)"
    )
    cached = llm.prefix_cache_stats
    if cached is not None:
        print(
            f"prefix cache ({engine.config.prefix_caching}): {cached.hits}/{cached.lookups} "
            f"requests hit, {cached.hit_tokens}/{cached.lookup_tokens} prompt tokens skipped, "
            f"{cached.block_evictions} block and {cached.state_evictions} state "
            "evictions"
        )
    if engine.config.speculative is not None:
        spec = stats.speculation
        print(
            f"speculative decoding ({engine.config.speculative.method}): {spec.num_accepted}/"
            f"{spec.num_drafted} drafts accepted (mean acceptance length "
            f"{spec.mean_acceptance_length:.2f})"
        )
