"""What every harness's report shares, and the engine harness's Markdown.

Shared: ``machine`` (the one machine description; ``machine_line`` is it in one line), ``now``,
``command`` (the command line a result records), ``named_json`` (a ``NAME=JSON`` option), ``write`` (the one report writer: JSON and its
Markdown, each file replaced whole) and ``goal_rows`` (a goal set as a table). The engine's
results dict: ``meta``, ``methods``, ``not_measured``, ``workloads`` (prompt ids and method ->
metrics), ``claims`` and ``goals`` (rows of ``bench.metrics.evaluate``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

SIMD = ("avx2", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict:
    """The CPU and the flags that pick its kernels (AVX2, VNNI, AVX-512, AMX), the GPU, the
    library versions and the load."""
    import torch
    import transformers

    from specdec.runtime.plan import cpu_flags

    info = {"cpu": cpu_model(), "cores": os.cpu_count(),
            "cpu_flags": sorted(f for f in cpu_flags() if f in SIMD or f.startswith("amx")),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "platform": platform.platform(),
            "device": device,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def machine_line(m: dict | None = None) -> str:
    """``m`` (default: this machine's ``machine()``) in one line."""
    m = m or machine()
    return (f"{m['cpu']} ({' '.join(m['cpu_flags']) or 'no AVX2'}), {m['cores']} CPU cores, "
            f"{m['torch_threads']} threads, torch {m['torch']}")


def now(fmt: str = "%Y-%m-%d %H:%M:%S %Z") -> str:
    return time.strftime(fmt)


def command(module: str, argv: list[str] | None) -> str:
    """``python -m MODULE ARGS`` as it ran (``argv`` None: this process's arguments)."""
    return f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)


def named_json(text: str, option: str, taken=()) -> tuple[str, dict]:
    """A ``NAME=JSON`` option's value (an arm, a variant) -> (name, the JSON object)."""
    name, sep, body = text.partition("=")
    try:
        value = json.loads(body) if sep and name else None
    except json.JSONDecodeError as e:
        raise ValueError(f"{option} {text!r}: the part after '=' is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{option} {text!r}: expected NAME={{JSON object}}")
    if name in taken:
        raise ValueError(f"{option} {text!r}: the name {name!r} is taken")
    return name, value


def write(out: Path, stem: str, result: dict, md: str | None = None, indent: int = 2) -> list[Path]:
    """``out/STEM.json`` and, given its Markdown, ``out/STEM.md``, each written to a temporary
    file and renamed (a reader never sees half a file); -> the paths."""
    out.mkdir(parents=True, exist_ok=True)
    texts = {out / f"{stem}.json": json.dumps(result, indent=indent, default=str) + "\n"}
    if md is not None:
        texts[out / f"{stem}.md"] = md
    for path, text in texts.items():
        path.with_suffix(".tmp").write_text(text)
        os.replace(path.with_suffix(".tmp"), path)
    return list(texts)


def goal_rows(goals: dict, measured: str = "measured", target: str = "target") -> list[str]:
    """Goals ``{name: {value, goal, met, lower_is_better?}}`` as a Markdown table."""
    lines = [f"| goal | {measured} | {target} | met |", "| --- | --- | --- | --- |"]
    for name, g in goals.items():
        sign = "<=" if g.get("lower_is_better") else ">="
        lines.append(f"| {name} | {g['value']:.2f} | {sign} {g['goal']} | {g['met']} |")
    return lines


# ---- the engine harness's Markdown ----------------------------------------------------------
def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


COLUMNS = ("method | tokens/s | vs ar | mean acc. len | target passes /100 tok | drafter | "
           "pre-verifier | target | overhead | same as ar | target log-lik./tok | "
           "regret /req | pass@1 | draft sources (rounds)")


def method_row(name: str, m: dict) -> str:
    share, mix = m.get("time_share") or {}, m.get("draft_sources")
    cells = [name, _num(m["tokens_per_s"]), _num(m.get("ratio_to_ar")),
             _num(m.get("mean_accepted_length")), _num(m.get("target_passes_per_100_tokens"), ".1f"),
             *(_pct(share.get(k)) for k in ("drafter", "preverifier", "target", "overhead")),
             _pct(m["same_as_ar"]),
             _num(m.get("target_log_likelihood"), ".4f"),
             _num(m.get("regret_per_request")) if not m["strict"] else "-",
             _pct(m.get("pass_at_1")), ", ".join(f"{k} {v}" for k, v in mix.items()) if mix else "-"]
    return "| " + " | ".join(cells) + " |"


def comparison_rows(rows: list[dict], goal: bool) -> list[str]:
    lines = ["| goal | workload | measured | minimum | result |" if goal else
             "| claim | workload | measured | against |", "|" + " --- |" * (5 if goal else 4)]
    for r in rows:
        value, last = r.get("note", "not measured"), "-"
        if r["value"] is not None:
            unit = " points" if r["points"] else ""
            value = f"{r['value']:.3f}{unit} ({r['num_value']:.3g} vs {r['den_value']:.3g})"
            last = r["denominator"]
        if goal:
            result = "-" if r["passed"] is None else ("pass" if r["passed"] else "MISS")
            last = f"{_num(r['minimum'], 'g')} | {result}"
        lines.append(f"| {r['title']} | {r['workload']} | {value} | {last} |")
    return lines


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [
        f"# Engine benchmark, {meta['date']}", "",
        f"Command: `{meta['command']}` (commit {(meta['git']['commit'] or 'unknown')[:12]}"
        f"{', uncommitted changes' if meta['git']['dirty'] else ''}).",
        f"Machine: {machine_line(meta['machine'])} on {meta['machine']['device']}.",
        f"Pair: target {meta['target']} ({meta['dtype']}), drafter {meta['drafter']}, "
        f"pre-verifier {meta['preverifier']}. Greedy, {meta['max_new_tokens']} new tokens, "
        f"{meta['repeats']} repeat(s), methods interleaved per prompt. Definitions: "
        "`bench/metrics.py`.", "", "## Methods", "",
        *(f"- `{n}`: {m['note']}" for n, m in results["methods"].items()),
        *(f"- `{n}`: {why}" for n, why in results["not_measured"].items()), "", "## Results", ""]
    for name, w in results["workloads"].items():
        broken = [m for m, x in w["methods"].items() if x.get("lossless") is False]
        lines += [f"### {name} ({len(w['prompts'])} prompts)", "", f"| {COLUMNS} |",
                  "|" + " --- |" * len(COLUMNS.split("|")),
                  *(method_row(m, x) for m, x in w["methods"].items()), "",
                  "Lossless check (strict methods reproduce the plain decoding of their dtype, "
                  "ar or ar_bf16, token for token): "
                  + ("all pass." if not broken else "FAILED for " + ", ".join(broken) + "."), ""]
    lines += ["## Research claims", "", *comparison_rows(results["claims"], goal=False)]
    if results.get("fastest_lossless"):
        lines += ["", "## The fastest lossless method", "",
                  f"`{results['fastest_lossless']}`: the strict method of our engine with the "
                  "highest geometric mean of its tokens/s ratios to `ar` over the workloads."]
    lines += ["", "## Goals (the served default)", "", *comparison_rows(results["goals"], goal=True)]
    return "\n".join(lines) + "\n"
