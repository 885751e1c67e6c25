"""`jmamba generate`: generate from the command line (default: a built-in tiny hybrid model)."""

from __future__ import annotations

import argparse
import sys

from runtime.llm import DEFAULT_MODEL, LLM
from runtime.sampling_params import SamplingParams
from runtime.speculative import METHODS, SpeculativeConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jmamba")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate tokens for one or more prompts")
    gen.add_argument("--model", default=DEFAULT_MODEL, help="preset (tiny-<family>) or HF dir")
    gen.add_argument("--prompt", action="append", help="text prompt (needs tokenizer.json)")
    gen.add_argument("--prompt-ids", action="append", help="comma-separated token ids")
    gen.add_argument("--max-tokens", type=int, default=16)
    gen.add_argument("--min-tokens", type=int, default=0, help="no stop token before this many")
    gen.add_argument("--ignore-eos", action="store_true", help="do not stop at the EOS ids")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--max-num-seqs", type=int, default=8)
    gen.add_argument("--max-model-len", type=int, default=256)
    gen.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget per step (default: derived from the model's chunk size)",
    )
    gen.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="ranks of the data-parallel mesh (one device each; pool sizes are per rank)",
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
    return prompts or [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]]


def _speculative(args: argparse.Namespace) -> SpeculativeConfig | None:
    if args.speculative_method is None:
        if args.draft_model is not None:
            raise ValueError("--draft-model needs --speculative-method draft_model")
        return None
    return SpeculativeConfig(args.speculative_method, args.num_speculative_tokens,
                             args.prompt_lookup_min, args.prompt_lookup_max,
                             args.draft_model)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.coordinator_address:
            from runtime.distributed import initialize

            initialize(args.coordinator_address, args.num_processes, args.process_id)
        prompts = _prompts(args)
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                max_tokens=args.max_tokens, min_tokens=args.min_tokens,
                                seed=args.seed, ignore_eos=args.ignore_eos)  # fmt: skip
        llm = LLM(args.model, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                  max_num_batched_tokens=args.max_num_batched_tokens,
                  data_parallel_size=args.data_parallel_size, speculative=_speculative(args),
                  warmup=False)  # fmt: skip
        outputs = llm.generate(prompts, params)
    except ValueError as error:
        print(f"jmamba: error: {error}", file=sys.stderr)
        return 2
    for output in outputs:
        shown = output.text if output.text is not None else output.token_ids
        print(f"[{output.request_id}] {output.finish_reason}: {shown}")
    engine = llm.engine
    print(f"{engine.stats.num_steps} steps, {engine.num_variants} compiled step variants")
    if engine.config.speculative is not None:
        spec = engine.stats.speculation
        print(f"{spec.num_accepted}/{spec.num_drafted} drafts accepted "
              f"(mean acceptance length {spec.mean_acceptance_length:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
