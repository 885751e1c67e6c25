"""`jmamba generate`: generate from the command line (default: the trained `tiny-stdlib` preset).

Prints, per prompt, the prompt and output text (or token ids without a tokenizer), the number of
tokens, the finish reason and the time to first token; then the model, where the time went
(import, load, compile, run) and the generation speed with compile time excluded. Argument
parsing loads no jax, so `--help` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import sys
import time

import jmamba.presets
from runtime.core.config import DEFAULT_PREFIX_CACHING, PREFIX_CACHING_MODES
from runtime.core.sampling_params import MAX_LOGPROBS, SamplingParams
from runtime.core.speculative_config import METHODS, SpeculativeConfig

PRESETS = [f"tiny-{name}" for name in jmamba.presets.names()]
DEFAULT_MODEL = "tiny-stdlib"
DEFAULT_TEXT_PROMPT = "def "


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jmamba")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser(
        "generate",
        help="generate text for one or more prompts",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Generate with a built-in preset, a Hugging Face checkpoint directory "
        "(config.json + *.safetensors [+ tokenizer.json]) or a Hugging Face hub id (org/name, "
        "downloaded into huggingface_hub's cache; offline with HF_HUB_OFFLINE=1). Without "
        f"--prompt or --prompt-ids the prompt is {DEFAULT_TEXT_PROMPT!r}.",
    )
    gen.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"a preset ({', '.join(PRESETS)}), a checkpoint directory or a hub id org/name",
    )
    gen.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="parameter dtype; auto: the checkpoint's",
    )
    gen.add_argument("--prompt", action="append", help="text prompt (repeat for several)")
    gen.add_argument("--prompt-ids", action="append", help="comma-separated token ids")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--min-tokens", type=int, default=0, help="no stop token before this many")
    gen.add_argument("--ignore-eos", action="store_true", help="do not stop at the EOS ids")
    gen.add_argument("--stop", action="append", help="stop string (repeat for several)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0 = no limit")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument(
        "--logprobs",
        type=int,
        default=None,
        help=f"print top-k log-probabilities, k <= {MAX_LOGPROBS}",
    )
    gen.add_argument("--max-num-seqs", type=int, default=8)
    gen.add_argument("--max-model-len", type=int, default=512)
    gen.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget per step (None: from the chunk size)",
    )
    gen.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="ranks of the data-parallel mesh (tensor-parallel-size devices each)",
    )
    gen.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="devices each rank's model is split over (heads, channels, experts, vocabulary)",
    )
    gen.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="fraction of each GPU's memory for parameters and pools: sizes the KV blocks "
        "(default: enough blocks for max-num-seqs requests of max-model-len)",
    )
    gen.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="schedule each step while the previous one runs on the device (same tokens; "
        "default: on unless speculative decoding is)",
    )
    cache = gen.add_argument_group("prefix caching (per rank)")
    cache.add_argument(
        "--prefix-caching",
        choices=PREFIX_CACHING_MODES,
        default=None,
        help=f"cache KV blocks and recurrent states of prompt prefixes (default: "
        f"{DEFAULT_PREFIX_CACHING} where the config can cache, else off)",
    )
    cache.add_argument(
        "--state-block-size",
        type=int,
        default=None,
        help="tokens per cached recurrent state, a multiple of the chunk and KV block sizes "
        "(default: their least common multiple)",
    )
    cache.add_argument(
        "--max-cached-states",
        type=int,
        default=None,
        help="state slots the cache may hold beside the running requests' (default: "
        "max(max_num_seqs, 16))",
    )
    spec = gen.add_argument_group("speculative decoding")
    spec.add_argument(
        "--speculative-method",
        choices=METHODS,
        default=None,
        help="propose drafts by prompt lookup (ngram) or with a draft model",
    )
    spec.add_argument("--num-speculative-tokens", type=int, default=3, help="K, drafts per step")
    spec.add_argument("--prompt-lookup-min", type=int, default=2, help="ngram: shortest n-gram")
    spec.add_argument("--prompt-lookup-max", type=int, default=4, help="ngram: longest n-gram")
    spec.add_argument(
        "--draft-model",
        default=None,
        help="draft_model: preset (tiny-<family>) or HF dir, same vocabulary",
    )
    multi = gen.add_argument_group(
        "multi-host (every process runs the same command with its own prompts)"
    )
    multi.add_argument("--coordinator-address", help="host:port of process 0")
    multi.add_argument("--num-processes", type=int, default=1)
    multi.add_argument("--process-id", type=int, default=0)
    return parser


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
    )


def _speculative(args: argparse.Namespace) -> SpeculativeConfig | None:
    if args.speculative_method is None:
        if args.draft_model is not None:
            raise ValueError("--draft-model needs --speculative-method draft_model")
        return None
    return SpeculativeConfig(
        args.speculative_method,
        args.num_speculative_tokens,
        args.prompt_lookup_min,
        args.prompt_lookup_max,
        args.draft_model,
    )


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = _parser().parse_args(argv)
    try:
        prompts, params = _prompts(args), _sampling_params(args)
        from runtime.llm import LLM  # loads jax: after the arguments are known to be good

        imported = time.perf_counter()
        if args.coordinator_address:
            from runtime.device.distributed import initialize

            initialize(args.coordinator_address, args.num_processes, args.process_id)
        llm = LLM(
            args.model,
            dtype=args.dtype,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            max_num_batched_tokens=args.max_num_batched_tokens,
            data_parallel_size=args.data_parallel_size,
            tensor_parallel_size=args.tensor_parallel_size,
            gpu_memory_utilization=args.gpu_memory_utilization,
            prefix_caching=args.prefix_caching,
            state_block_size=args.state_block_size,
            max_cached_states=args.max_cached_states,
            async_scheduling=args.async_scheduling,
            speculative=_speculative(args),
        )
        if not prompts:
            prompts = [DEFAULT_TEXT_PROMPT] if llm.tokenizer is not None else [[1, 2, 3, 4]]
        outputs = llm.generate(prompts, params, use_tqdm=False)
    except ValueError as error:
        print(f"jmamba: error: {error}", file=sys.stderr)
        return 2
    for prompt, output in zip(prompts, outputs, strict=True):
        _print_output(prompt, output, llm.tokenizer)
    _print_summary(llm, outputs, import_seconds=imported - started)
    return 0


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
    size = f"{engine.runner.num_params / 1e6:.2f}M params"
    print(
        f"model: {llm.name} ({llm.model.config.architecture}, {size}, {llm.model.dtype}, "
        f"{tokenizer})"
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


if __name__ == "__main__":
    sys.exit(main())
