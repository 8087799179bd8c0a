"""The served harness: the served default and plain AR over HTTP, at concurrency levels.

The served default (``configs/serve/local.yaml`` with its ``default_pair``, as ``make serve``
resolves it) and the same app with ``drafter: none`` side by side on one embedded Ray; each level
a closed loop of ``c`` clients over the same prompts, levels and methods interleaved, the order
rotated each repeat. Per (method, level): aggregate tokens/s, p50 / p95 latency, the target's
steps (``GET /debug/metrics``) and whether every output equals the method's concurrency-1 one and
its plain decoding's (the SD app's suffix tree does not learn online here: every level sends the
same prompts). Arms beside them: ``--engine`` the SD app's engine in this process (no Ray or HTTP,
concurrency 1: the outputs the served ones must equal); ``--variant NAME=JSON`` the default with
those args changed (dicts merged one level deep; ``"drafter": "none"`` decodes plainly);
``--peer NAME=URL`` an OpenAI-compatible server already running, such as llama.cpp's
``llama-server`` (``make llama-server``) on the target's GGUF (a peer decodes in its own
numerics: its outputs are not compared). Writes ``result.json`` and ``result.md``.

    python -m bench.batching --prompts 16 --max-tokens 64 --concurrency 1 2 4 8 16 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import torch
import yaml
from tqdm import tqdm

from bench import humaneval
from bench.report import command, goal_rows, machine_line, named_json, now, write

SD_ONLY = ("preverifier", "block_drafter", "suffix")  # args that mean nothing without a drafter
BUILTIN = ("ar", "sd", "sd_engine")  # the arms every --variant sits beside
SPLIT = ("target_ms_per_round", "rest_ms_per_round", "drafted_per_round", "accepted_per_round")
STEPS = ("step_tokens", "step_ms", "target_busy")  # the served levels' target steps


def prompts_from_file(path: str) -> list[str]:
    prompts = json.loads(Path(path).read_text())
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, str) for p in prompts)):
        raise SystemExit(f"--prompts-file: {path} must hold a non-empty JSON list of strings")
    return prompts


def chat_prompts(n: int, target: str) -> list[str]:
    """The first ``n`` held-out ShareGPT turns in ``target``'s chat template, as raw prompts."""
    from transformers import AutoTokenizer

    from pipelines.common.datasets import benchmark_chats
    from specdec.models.sources import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(target))
    return [tokenizer.apply_chat_template([{"role": "user", "content": turn}], tokenize=False,
                                          add_generation_prompt=True)
            for _, turn in benchmark_chats(n)]


def served_default(config_path: str) -> dict:
    """The app args ``make serve`` serves for this config (the default pair resolved)."""
    from cluster.default_pair import serve_args

    doc = yaml.safe_load(Path(config_path).read_text())
    args = doc["applications"][0]["args"]
    return serve_args(args, doc.get("default_pair"), doc.get("default_drafter", "block"))


def method_args(sd: dict, variants: dict[str, dict] | None = None) -> dict[str, dict]:
    """App args by arm: ``ar``, ``sd`` (its suffix tree not grown online) and each variant."""
    ar = {k: v for k, v in sd.items() if k not in SD_ONLY} | {"drafter": "none"}
    if "suffix" in sd:
        sd = sd | {"suffix": {**sd["suffix"], "online": False}}
    apps = {"ar": ar, "sd": sd}
    for name, changes in (variants or {}).items():
        app = merged(sd, changes)
        apps[name] = app if app.get("drafter") != "none" else {
            k: v for k, v in app.items() if k not in SD_ONLY}  # a plain-decoding variant
    return apps


def merged(args: dict, changes: dict) -> dict:
    """``args`` with ``changes``: a dict value is merged into the dict it replaces."""
    out = dict(args)
    for key, value in changes.items():
        old = out.get(key)
        out[key] = {**old, **value} if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def parse_peer(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not (sep and name and url.startswith(("http://", "https://"))):
        raise ValueError(f"--peer {text!r}: expected NAME=URL of an OpenAI-compatible server")
    if name in BUILTIN:
        raise ValueError(f"--peer {text!r}: the name {name!r} is taken")
    return name, url.rstrip("/")


def rotated(methods: list[str], r: int) -> list[str]:
    """The order of repeat ``r``: each repeat starts one further along, so no method always runs
    first or right after the same one (the machine drifts within a level too)."""
    k = r % len(methods)
    return methods[k:] + methods[:k]


class InProcess:
    """The SD app's engine in this process, without Ray or HTTP: the same models, settings,
    suffix tree and thread count as its target actor."""

    def __init__(self, args: dict):
        from cluster.app import resolve_references
        from cluster.schema import ServeArgs
        from specdec.engine.engine import Engine
        from specdec.engine.loading import load_pair
        from specdec.engine.settings import SpecSettings
        from specdec.models.suffix import SuffixConfig

        a = resolve_references(ServeArgs.model_validate(args))
        torch.set_num_threads(a.target_resources.threads)
        pair = load_pair(a.target, a.drafter, a.preverifier, a.dtype,
                         suffix=SuffixConfig(**a.suffix.model_dump()), block_drafter=a.block_drafter)
        self.engine = Engine(pair.target, pair.drafter, pair.preverifier)
        self.tokenizer = pair.target.tokenizer
        self.spec = SpecSettings(**a.speculative.model_dump(exclude_unset=True))

    def complete(self, prompt: str, max_tokens: int) -> dict:
        from specdec.engine.settings import GenerationParams

        t0 = time.perf_counter()
        out = self.engine.generate(self.tokenizer(prompt)["input_ids"],
                                   GenerationParams(max_tokens, spec=self.spec))
        return {"token_ids": out.token_ids, "tokens": len(out.token_ids),
                "latency_s": time.perf_counter() - t0, "spec_decode": out.stats.to_dict()}

    def level(self, prompts: list[str], max_tokens: int) -> dict:
        """One client, prompt after prompt, as concurrency 1 runs them over HTTP."""
        t0 = time.perf_counter()
        outs = [self.complete(p, max_tokens) for p in prompts]
        return level(outs, time.perf_counter() - t0, None)


def level(outs: list[dict], wall: float, mean_batch: float | None) -> dict:
    """One level's numbers from its replies (token_ids, tokens, latency_s, spec_decode each)."""
    latencies = sorted(o["latency_s"] for o in outs)
    tokens = sum(o["tokens"] for o in outs)
    p95 = latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]  # nearest rank
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "p50_s": statistics.median(latencies), "p95_s": p95, "mean_batch": mean_batch,
            **round_split(outs), "token_ids": [o["token_ids"] for o in outs]}


def round_split(outs: list[dict]) -> dict:
    """A round's time from the replies' ``spec_decode`` stats: the target's forward and
    verification, and the rest (drafter, actor calls, scheduling, glue: at one client against
    the engine, what serving adds); and the draft tokens a round sent and had accepted."""
    stats = [o["spec_decode"] for o in outs if o.get("spec_decode")]
    rounds = sum(s["rounds"] for s in stats)
    if not rounds:
        return {}
    target = sum(s["time_s"]["target"] for s in stats)
    total = sum(s["time_s"]["total"] for s in stats)
    return {"target_ms_per_round": 1e3 * target / rounds,
            "rest_ms_per_round": 1e3 * (total - target) / rounds,
            "drafted_per_round": sum(s["drafted"] for s in stats) / rounds,
            "accepted_per_round": sum(s["accepted"] for s in stats) / rounds}


def start(apps: dict[str, dict], port: int) -> str:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from cluster.app import build_app

    # a Ray instance of its own; logical CPUs: only one app works at a time, but each reserves
    # its actors' shares
    ray.init(address="local", num_cpus=4 * len(apps), include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    for name, args in apps.items():
        serve.run(build_app(args), name=name, route_prefix=f"/{name}")
    return f"http://127.0.0.1:{port}"


def complete(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    r = requests.post(f"{url}/v1/completions", json=body, timeout=900)
    r.raise_for_status()
    out = r.json()
    ids = out["choices"][0].get("token_ids")  # specdec's; a peer may only count them in usage
    return {"token_ids": ids, "tokens": out["usage"]["completion_tokens"],
            "latency_s": time.perf_counter() - t0, "spec_decode": out.get("spec_decode")}


def run_level(url: str, model: str, prompts: list[str], max_tokens: int, c: int,
              peer: bool = False) -> dict:
    """One level over HTTP; a ``peer`` has no ``/debug/metrics`` (no target steps counted)."""
    def totals() -> dict:
        return {} if peer else requests.get(f"{url}/debug/metrics", timeout=30).json()

    before, t0 = totals(), time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        outs = list(pool.map(lambda p: complete(url, model, p, max_tokens), prompts))
    wall, after = time.perf_counter() - t0, totals()
    delta = {k: after.get(k, 0) - before.get(k, 0)
             for k in ("steps", "step_requests", "step_tokens", "step_s")}
    steps = delta["steps"]
    out = level(outs, wall, delta["step_requests"] / steps if steps else None)
    if steps:  # the target's steps: their mean size and time, and the share of the wall they fill
        out |= {"step_tokens": delta["step_tokens"] / steps,
                "step_ms": 1e3 * delta["step_s"] / steps, "target_busy": delta["step_s"] / wall}
    return out


def references(apps: dict[str, dict]) -> dict[str, str]:
    """Each app's plain-decoding reference: the first plain app (``ar`` first) of its numerics
    (dtype, attention, linears, KV caches: other numerics decode other tokens); ``sd_engine``
    checks against ``sd``'s."""
    def numerics(args: dict) -> tuple:
        return (args.get("dtype"), args.get("attention", "auto"), args.get("linears", "auto"),
                args.get("kv_cache_dtype", "auto"), args.get("isa", "auto"))

    plain: dict[tuple, str] = {}
    for name in ("ar", *apps):
        if apps[name].get("drafter") == "none":
            plain.setdefault(numerics(apps[name]), name)
    refs = {name: plain.get(numerics(args), "ar") for name, args in apps.items()}
    return refs | {"sd_engine": refs["sd"]}


def summarise(runs: dict, refs: dict[str, str] | None = None, peers=()) -> dict:
    """Medians over repeats per (method, concurrency), and the output checks: the same as the
    method's concurrency-1 outputs and as its reference's (``refs``; default ``ar``); None for
    ``peers``."""
    summary = {}
    for (method, c), rs in runs.items():
        medians = {k: statistics.median(r[k] for r in rs) if all(r.get(k) is not None for r in rs)
                   else None for k in ("tokens_per_s", "p50_s", "p95_s", "mean_batch", *SPLIT, *STEPS)}
        summary.setdefault(method, {})[c] = {k: v for k, v in medians.items()
                                             if v is not None or k == "mean_batch"}
    seq = {m: runs[(m, 1)][0]["token_ids"] for m in summary if (m, 1) in runs}
    if "sd_engine" in seq:  # the engine's outputs are what the served SD app must return
        seq["sd"] = seq["sd_engine"]
    refs, checks = refs or {}, {}
    for (m, c), rs in runs.items():
        ar = seq.get(refs.get(m, "ar"))
        checks[f"{m}@c{c}"] = (
            {"same_as_sequential": None, "same_as_ar": None, "reference": None} if m in peers else
            {"same_as_sequential": all(r["token_ids"] == seq.get(m, ar) for r in rs),
             "same_as_ar": all(r["token_ids"] == ar for r in rs), "reference": refs.get(m, "ar")})
    return {"summary": summary, "checks": checks}


def ratio(summary: dict, a: str, b: str, c: int, goal: float) -> dict | None:
    if c in summary.get(a, {}) and c in summary.get(b, {}):
        return {"value": summary[a][c]["tokens_per_s"] / summary[b][c]["tokens_per_s"],
                "goal": goal}
    return None


def goals(summary: dict, refs: dict[str, str] | None = None, peers=(), plain=()) -> dict:
    """The served goals: plain AR scales with clients, SD (and each SD variant) beats its plain
    reference at 8, latency holds, serving adds little to the engine; against each of ``peers``
    at 1 and 8 clients, SD at least as fast and plain AR at least 0.9x. ``plain``: the
    plain-decoding variants (references, not held to goals)."""
    refs, out = refs or {}, {}
    ar = summary["ar"]
    if 8 in ar and 1 in ar:
        out["ar_c8_over_c1"] = {"value": ar[8]["tokens_per_s"] / ar[1]["tokens_per_s"], "goal": 4.0}
    for name in ("sd", *(m for m in summary if m not in (*BUILTIN, *peers, *plain))):
        base = refs.get(name, "ar")
        if base != name and (g := ratio(summary, name, base, 8, 1.3)):
            out[f"{name}_c8_over_{base}_c8"] = g
    for name in ("sd", "ar"):
        if 8 in summary[name] and 1 in summary[name]:
            out[f"{name}_p50_c8_over_c1"] = {
                "value": summary[name][8]["p50_s"] / summary[name][1]["p50_s"], "goal": 2.0,
                "lower_is_better": True}
    for peer in peers:
        for name, goal in (("sd", 1.0), ("ar", 0.9)):
            for c in (1, 8):
                if g := ratio(summary, name, peer, c, goal):
                    out[f"{name}_c{c}_over_{peer}_c{c}"] = g
    if g := ratio(summary, "sd", "sd_engine", 1, 0.95):
        out["sd_served_c1_over_engine"] = g
    for g in out.values():
        g["met"] = bool(g["value"] <= g["goal"] if g.get("lower_is_better")
                        else g["value"] >= g["goal"])
    return out


def markdown(result: dict) -> str:
    meta, s = result["meta"], result["summary"]
    source = (f"prompts of {meta['prompts_file']}" if meta.get("prompts_file") else
              "held-out ShareGPT chat prompts" if meta.get("chat") else "HumanEval prompts")
    lines = [f"Date {meta['date']}, machine: {meta['machine']}. Command: `{meta['command']}`.",
             f"Served: {meta['served']}. {meta['prompts']} {source}, "
             f"{meta['max_tokens']} new tokens, {meta['repeats']} repeats (medians).", "",
             "| method | concurrency | aggregate tok/s | p50 latency s | p95 latency s | mean batch | "
             "target ms / round | rest ms / round | drafted / round | accepted / round | "
             "tokens / step | ms / step | target busy | same as sequential | same as its AR |",
             "|" + " --- |" * 15]
    for method, levels in s.items():
        for c, v in sorted(levels.items()):
            chk = result["checks"][f"{method}@c{c}"]
            batch = "-" if v["mean_batch"] is None else f"{v['mean_batch']:.2f}"
            split = " | ".join(f"{v[k]:.{1 if 'ms' in k else 2}f}" if k in v else "-"
                              for k in SPLIT + STEPS)
            same = ("not compared | not compared" if chk["reference"] is None else
                    f"{chk['same_as_sequential']} | {chk['same_as_ar']} ({chk['reference']})")
            lines.append(f"| {method} | {c} | {v['tokens_per_s']:.2f} | {v['p50_s']:.2f} | "
                         f"{v['p95_s']:.2f} | {batch} | {split} | {same} |")
    if peers := [f"`{name}`: {how}" for name, how in meta.get("peers", {}).items()]:
        lines += ["", "Peers (external servers, their own numerics: outputs not compared): "
                  + "; ".join(peers) + "."]
    return "\n".join([*lines, "", *goal_rows(result["goals"])]) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/serve/local.yaml")
    ap.add_argument("--prompts", type=int, default=16,
                    help="how many prompts: the first N of HumanEval (or of --chat)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompts-file", help="a JSON list of prompt strings, in place of HumanEval's")
    ap.add_argument("--chat", action="store_true",
                    help="--prompts held-out ShareGPT turns (chat template), in place of HumanEval")
    ap.add_argument("--engine", action="store_true",
                    help="also run the SD app's engine in this process, one prompt at a time")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                    help="one more app: the default with these args changed")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=URL",
                    help="an external OpenAI-compatible server already running at URL, as an arm")
    ap.add_argument("--port", type=int, default=8012)
    ap.add_argument("--out", default="docs/benchmarks/batching")
    a = ap.parse_args(argv)
    if a.engine and 1 not in a.concurrency:
        ap.error("--engine compares with concurrency 1: include 1 in --concurrency")
    if a.chat and a.prompts_file:
        ap.error("--chat and --prompts-file both choose the prompts: give one")
    try:
        variants = dict(named_json(v, "--variant", BUILTIN) for v in a.variant)
        peers = dict(parse_peer(p) for p in a.peer)
        sd = served_default(a.config)
    except ValueError as e:
        ap.error(str(e))
    prompts = (prompts_from_file(a.prompts_file) if a.prompts_file else
               chat_prompts(a.prompts, sd["target"]) if a.chat else humaneval.prompts(a.prompts))
    if set(peers) & set(variants):
        ap.error(f"--peer: a name is taken by a variant: {sorted(peers)}")
    run(a, argv, prompts, sd, method_args(sd, variants), variants, peers)


def run(a, argv, prompts: list[str], sd: dict, apps: dict[str, dict], variants: dict,
        peers: dict[str, str]) -> None:
    url = start(apps, a.port)
    model = sd.get("model_id") or sd["target"]
    urls = {name: f"{url}/{name}" for name in apps} | peers
    models = {name: model for name in apps} | {  # a peer's: the first of its GET /v1/models
        name: requests.get(f"{u}/v1/models", timeout=30).json()["data"][0]["id"]
        for name, u in peers.items()}
    for name in urls:  # warm-up
        complete(urls[name], models[name], prompts[0], 8)
    engine = InProcess(apps["sd"]) if a.engine else None
    if engine is not None:
        engine.complete(prompts[0], 8)
    methods = [*apps, *peers, *(["sd_engine"] if engine else [])]
    plan = [(c, m) for r in range(a.repeats) for c in a.concurrency for m in rotated(methods, r)
            if m != "sd_engine" or c == 1]
    runs: dict[tuple[str, int], list[dict]] = {}
    for c, m in tqdm(plan, desc="levels"):
        runs.setdefault((m, c), []).append(
            engine.level(prompts, a.max_tokens) if m == "sd_engine" else
            run_level(urls[m], models[m], prompts, a.max_tokens, c, peer=m in peers))
    refs = references(apps)
    result = summarise(runs, refs, peers)  # summary: method -> concurrency ("c" in JSON) -> ...
    plain = [n for n, args in apps.items() if args.get("drafter") == "none"]
    result["goals"] = goals(result["summary"], refs, peers, plain)
    result["meta"] = {
        "date": now("%Y-%m-%d"), "command": command("bench.batching", argv),
        "machine": machine_line(),
        "served": {k: v for k, v in sd.items() if k not in ("api_key",)}, "variants": variants,
        "peers": peers,
        "prompts": len(prompts), "prompts_file": a.prompts_file, "chat": a.chat,
        "max_tokens": a.max_tokens,
        "repeats": a.repeats}
    result["runs"] = [{"method": m, "concurrency": c, **{k: v for k, v in r.items() if k != "token_ids"}}
                      for (m, c), rs in runs.items() for r in rs]
    md = markdown(result)
    write(Path(a.out), "result", result, md)
    print(md)


if __name__ == "__main__":
    main()
