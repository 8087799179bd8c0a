"""The ``specdec`` command line: generate text with speculative decoding, prepare models.

    specdec generate --target smollm2-135m --drafter ngram --prompt "def fib(n):"
    specdec models tiny OUT
    specdec models prepare smollm2-135m
    specdec plan --target smollm2-135m --device cuda --device-memory 80GiB --json
    specdec plan --config configs/serve/gpu.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specdec.algorithms.policies import POLICIES
from specdec.algorithms.verify import VERIFIERS
from specdec.engine.settings import FLAT, flat_knob
from specdec.knobs import add_option
from specdec.models.drafters import DRAFTERS
from specdec.runtime.plan import (
    ATTENTIONS,
    BACKENDS,
    DTYPE_NAMES,
    ISAS,
    KV_CACHE_DTYPES,
    LINEARS,
    SWITCHES,
    WAIT_POLICIES,
)


def add_generate(sub) -> None:
    g = sub.add_parser("generate", help="generate one completion in the single-process engine")
    g.add_argument("--target", required=True, help="named source, model directory or HF id")
    g.add_argument("--drafter", default="none",
                   help=f"{' | '.join(DRAFTERS.named())} | block-drafter checkpoint | "
                        "AR draft LM path or id")
    g.add_argument("--suffix-index", default=None,
                   help="suffix/hybrid: index directory or models:/NAME@ALIAS (none: local tree only)")
    g.add_argument("--block-drafter", default=None,
                   help="hybrid: the block-drafter checkpoint (with --preverifier)")
    g.add_argument("--preverifier", default=None,
                   help="pre-verifier checkpoint for PACER, or 'untrained' (random weights)")
    g.add_argument("--acceptance", default=None,
                   help="the drafter's acceptance model for PACER and the drafts' survival: a "
                        "checkpoint, models:/NAME@ALIAS, or 'untrained'")
    add_speculative(g)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    add_runtime(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from a file")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--json", action="store_true", help='print {"text", "token_ids", "stats"}')
    g.set_defaults(func=run_generate)


def add_runtime(g) -> None:
    """The target runtime's knobs (``specdec.runtime.RuntimeConfig``), for generate and plan."""
    r = g.add_argument_group("the target's runtime (its plan: specdec.runtime.plan)")
    r.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    r.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (auto: a GPU if visible)")
    r.add_argument("--backend", default="auto", choices=BACKENDS)
    r.add_argument("--linears", default="auto", choices=LINEARS)
    r.add_argument("--attention", default="auto", choices=ATTENTIONS)
    r.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    r.add_argument("--isa", default="auto", choices=ISAS,
                   help="x86: the instruction set of specdec's kernels (avx2: as on a CPU "
                        "without AVX-512; auto: the CPU's)")
    r.add_argument("--max-model-len", type=int, default=None,
                   help="positions a KV slot holds (default: what memory allows)")
    r.add_argument("--threads", type=int, default=None,
                   help="torch's threads (default: the CPUs this process may use)")
    r.add_argument("--omp-wait-policy", default="auto", choices=WAIT_POLICIES,
                   help="how OpenMP's threads wait between parallel regions (auto: libgomp's default)")
    r.add_argument("--threads-by-load", default="auto", choices=SWITCHES,
                   help="each pass on 1 thread or --threads, the faster now (auto: on where a "
                        "pass's bits do not depend on its threads)")


def runtime_knobs(args) -> dict:
    return dict(backend=args.backend, linears=args.linears, attention=args.attention,
                kv_cache_dtype=args.kv_cache_dtype, max_model_len=args.max_model_len,
                omp_wait_policy=args.omp_wait_policy, isa=args.isa,
                threads_by_load=args.threads_by_load)


def add_plan(sub) -> None:
    p = sub.add_parser("plan", help="resolve and print the target's runtime plan (no weights)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path,
                     help="a serve config, a KubeRay manifest or a pipeline config")
    src.add_argument("--target", help="named source, model directory or HF id")
    add_runtime(p)
    p.add_argument("--slots", type=int, default=8, help="KV slots (requests held at once)")
    p.add_argument("--device-memory", default=None,
                   help="what the plan may take of the device, e.g. 80GiB (default: the "
                        "device's own, which must then be here)")
    p.add_argument("--json", action="store_true", help="print the plans as JSON")
    p.set_defaults(func=run_plan)


def run_plan(args) -> int:
    """Print each plan; exit 1, naming the fields to change, when one does not fit."""
    from dataclasses import replace

    from specdec.models.sources import model_config
    from specdec.planning import Planned, planned
    from specdec.runtime.plan import PlanError, RuntimeConfig, resolve_plan

    if args.config is not None:
        todo = planned(args.config)
    else:
        todo = [Planned("flags", args.target, RuntimeConfig(
            args.device, args.dtype, slots=args.slots, threads=args.threads,
            **runtime_knobs(args)))]
    results, failed = [], False
    if args.device_memory is None and any(not present(i, args) for i in todo):
        raise ValueError("a GPU that is not here: give its memory (--device-memory 80GiB)")
    for item in todo:
        config = item.config if args.config is None or args.device == "auto" else \
            replace(item.config, device=args.device)
        hf_config, blocks = model_config(item.target)
        entry = {"source": item.source, "target": item.target}
        try:
            entry["plan"] = resolve_plan(config, hf_config, blocks, args.device_memory,
                                         present=False).to_dict()
        except PlanError as err:
            entry["error"], failed = str(err), True
        results.append(entry)
    if args.json:
        print(json.dumps(results if args.config is not None else results[0], indent=2))
    else:
        from specdec.runtime.plan import describe
        for entry in results:
            print(f"{entry['source']} ({entry['target']}):")
            print(describe(entry["plan"]) if "plan" in entry else f"  error: {entry['error']}")
    return 1 if failed else 0


def present(item, args) -> bool:
    """Whether the device an item plans for is here (a GPU torch sees, or not a GPU)."""
    import torch

    device = args.device if args.device != "auto" or args.config is None else item.config.device
    return not str(device).startswith("cuda") or torch.cuda.is_available()


def add_speculative(g) -> None:
    """--policy, --verify and one option per flat key of the speculative settings, each with its
    knob's type, default and help (``specdec.engine.settings.FLAT``)."""
    group = g.add_argument_group("speculative settings (each knob's config: specdec/algorithms, "
                                 "specdec/models/suffix.py, hybrid.py)")
    group.add_argument("--policy", default="fixed", choices=POLICIES.names())
    group.add_argument("--verify", default=None, choices=VERIFIERS.names(),
                       help="default: strict at temperature 0, sample above")
    for key in FLAT:
        add_option(group, *flat_knob(key), flag=key.replace("_", "-"), dest=key)


def add_models(sub) -> None:
    m = sub.add_parser("models", help="build or prepare models").add_subparsers(dest="models_cmd",
                                                                               required=True)
    tiny = m.add_parser("tiny", help="write a tiny random target, AR drafter and block drafter")
    tiny.add_argument("out", type=Path)
    tiny.add_argument("--arch", default="llama", choices=["llama", "qwen3"])
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=run_tiny)
    prep = m.add_parser("prepare", help="convert a named source to a safetensors cache")
    prep.add_argument("name")
    prep.set_defaults(func=run_prepare)


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    if not text.strip():
        raise ValueError("the prompt is empty")
    if chat:
        if tokenizer.chat_template is None:
            raise ValueError("--chat: the target's tokenizer has no chat template")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return tokenizer(text)["input_ids"]


def own_process(args) -> None:
    """What ``specdec generate``, the program, applies of its plan to its process before it
    loads: OpenMP's variables (``specdec.runtime.plan.omp_env``: it runs again in a process
    started with them unless this one was, since OpenMP read the environment when torch
    loaded) and torch's threads (the plan records them)."""
    import torch

    from specdec.runtime.plan import RuntimeConfig, omp_env, usable_cpus

    asked = RuntimeConfig(threads=args.threads, omp_wait_policy=args.omp_wait_policy)
    env = omp_env(asked.omp_wait_policy)
    if any(os.environ.get(k) != v for k, v in env.items()):
        os.execve(sys.executable, [sys.executable, "-m", "specdec.cli", *sys.argv[1:]],
                  {**os.environ, **env})
    torch.set_num_threads(asked.threads or usable_cpus()[0])


def run_generate(args) -> int:
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_pair
    from specdec.engine.settings import GenerationParams, SpecSettings
    from specdec.models.registry import resolve_model_ref
    from specdec.models.suffix import SuffixConfig

    spec = SpecSettings(policy=args.policy, verify=args.verify,
                        **{key: getattr(args, key) for key in FLAT})
    params = GenerationParams(args.max_new_tokens, args.temperature, args.seed, spec)
    text = args.prompt if args.prompt is not None else args.prompt_file.read_text()
    if "scorer" in POLICIES.get(args.policy).needs and not (args.preverifier or args.acceptance):
        raise ValueError(f"--policy {args.policy} needs --preverifier "
                         "(a trained pre-verifier checkpoint) or --acceptance")
    if args.suffix_index and "suffix" not in DRAFTERS.resolve(args.drafter).needs:
        readers = [e.name for e in DRAFTERS.entries if "suffix" in e.needs]
        raise ValueError(f"--suffix-index needs --drafter {' or '.join(readers)}")
    pair = load_pair(args.target, args.drafter, args.preverifier, args.dtype, args.device,
                     SuffixConfig(index=args.suffix_index), args.block_drafter,
                     resolve_model_ref(args.acceptance), **runtime_knobs(args))
    plan = pair.target.plan
    print(plan.describe() if plan else "plan: transformers (not the runtime)", file=sys.stderr)
    prompt_ids = encode_prompt(pair.target.tokenizer, text, args.chat)
    stream = Engine(pair.target, pair.drafter, pair.preverifier,
                    pair.acceptance).stream(prompt_ids, params)
    decode = pair.target.tokenizer.decode
    if args.json:
        out = stream.result()
        print(json.dumps({"text": decode(out.token_ids, skip_special_tokens=True),
                          "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                          "stats": {**out.stats.to_dict(), "backend": pair.target.backend},
                          "plan": plan.to_dict() if plan else None}))
        return 0
    shown = ""
    for _ in stream:  # print text as it is committed, round by round
        text_so_far = decode(stream.token_ids, skip_special_tokens=True)
        print(text_so_far[len(shown):], end="", flush=True)
        shown = text_so_far
    s = stream.stats
    print(f"\n\n[{s.committed} tokens, {s.rounds} rounds, mean accepted length "
          f"{s.mean_accepted_length:.2f}, {s.tokens_per_s:.1f} tok/s]", file=sys.stderr)
    return 0


def run_tiny(args) -> int:
    from specdec.models.tiny import make_tiny_models

    for name, path in make_tiny_models(args.out, args.arch, args.seed).items():
        print(f"{name}: {path}")
    return 0


def run_prepare(args) -> int:
    from specdec.models.sources import NAMED_SOURCES, prepare

    if args.name not in NAMED_SOURCES:
        raise ValueError(f"unknown named source {args.name!r}; known: {sorted(NAMED_SOURCES)}")
    print(prepare(args.name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_generate(sub)
    add_plan(sub)
    add_models(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.func is run_generate and argv is None:  # the program, not a caller in-process
            own_process(args)
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
