"""What the three harnesses' reports share, and the engine harness's Markdown.

Shared: ``machine`` (one machine description; ``machine_line`` is it in one line), ``now``,
``command`` (the command line a result records), ``write`` (the one report writer: JSON and its
Markdown) and ``goal_rows`` (a served goal set as a table). The engine's ``results`` is the dict
written to ``results.json``: ``meta`` (date, command, machine, commit, settings), ``methods``
(name -> what it runs), ``not_measured`` (name -> why), ``workloads`` (workload -> prompt ids and
method -> metrics), ``claims`` and ``goals`` (rows from ``bench.metrics.evaluate``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


SIMD = ("avx2", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")


def simd_flags() -> list[str]:
    """The CPU's flags that decide which kernels run (ours and a peer's such as llama.cpp):
    AVX2, AVX-VNNI, the AVX-512 families the int8 and bfloat16 paths use, and AMX."""
    from specdec.runtime.plan import cpu_flags

    return sorted(f for f in cpu_flags() if f in SIMD or f.startswith("amx"))


def machine(device: str = "cpu") -> dict:
    import torch

    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "cpu_flags": simd_flags(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "platform": platform.platform(), "device": device,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def machine_line() -> str:
    """``machine``'s facts in one line, for the served and passes reports."""
    m = machine()
    flags = " ".join(m["cpu_flags"]) or "no AVX2"
    return (f"{m['cpu']} ({flags}), {m['cores']} CPU cores, {m['torch_threads']} threads, "
            f"torch {m['torch']}")


def now(fmt: str = "%Y-%m-%d %H:%M:%S %Z") -> str:
    return time.strftime(fmt)


def command(module: str, argv: list[str] | None) -> str:
    """``python -m MODULE ARGS`` as it ran (``argv`` None: this process's arguments)."""
    return f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)


def write(out: Path, stem: str, result: dict, md: str | None = None, indent: int = 2) -> list[Path]:
    """``out/STEM.json`` (the result) and, given its Markdown, ``out/STEM.md``; the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.json"]
    paths[0].write_text(json.dumps(result, indent=indent, default=str) + "\n")
    if md is not None:
        paths.append(out / f"{stem}.md")
        paths[1].write_text(md)
    return paths


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


COLUMNS = ("method | tokens/s | vs ar | best-of-repeats tok/s | mean acc. len | "
           "target passes /100 tok | drafter | pre-verifier | target | overhead | peak RSS MB | "
           "same as ar | target log-lik./tok | regret /req | pass@1 | draft sources (rounds)")
GOAL_SETS = {"pacer": "PACER on the block drafter", "default": "the served default"}


def method_row(name: str, m: dict) -> str:
    share, mix = m.get("time_share") or {}, m.get("draft_sources")
    cells = [name, _num(m["tokens_per_s"]), _num(m.get("ratio_to_ar")),
             _num(m.get("tokens_per_s_best")), _num(m.get("mean_accepted_length")),
             _num(m.get("target_passes_per_100_tokens"), ".1f"),
             *(_pct(share.get(k)) for k in ("drafter", "preverifier", "target", "overhead")),
             _num(m.get("peak_rss_mb"), ".0f"), _pct(m["same_as_ar"]),
             _num(m.get("target_log_likelihood"), ".4f"),
             _num(m.get("regret_per_request")) if not m["strict"] else "-",
             _pct(m.get("pass_at_1")), ", ".join(f"{k} {v}" for k, v in mix.items()) if mix else "-"]
    return "| " + " | ".join(cells) + " |"


def workload_table(name: str, w: dict) -> list[str]:
    lines = [f"### {name} ({len(w['prompts'])} prompts)", "", f"| {COLUMNS} |",
             "|" + " --- |" * len(COLUMNS.split("|"))]
    lines += [method_row(m, metrics) for m, metrics in w["methods"].items()]
    broken = [m for m, x in w["methods"].items() if x.get("lossless") is False]
    lines += ["", "Lossless check (strict methods reproduce the plain decoding of their dtype, "
              "ar or ar_bf16, token for token): "
              + ("all pass." if not broken else "FAILED for " + ", ".join(broken) + "."), ""]
    return lines


def comparison_rows(rows: list[dict], goal: bool) -> list[str]:
    head = "| goal | workload | measured | minimum | result |" if goal else \
        "| claim | workload | measured | against |"
    lines = [head, "|" + " --- |" * (5 if goal else 4)]
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
    meta, mach = results["meta"], results["meta"]["machine"]
    repeats = f"{meta['repeats']} repeat{'' if meta['repeats'] == 1 else 's'}"
    lines = [
        f"# Engine benchmark, {meta['date']}", "",
        f"Command: `{meta['command']}` (commit {(meta['git']['commit'] or 'unknown')[:12]}"
        f"{', uncommitted changes' if meta['git']['dirty'] else ''}).",
        f"Machine: {mach['cpu']} ({' '.join(mach.get('cpu_flags') or ['no AVX2'])}), "
        f"{mach['cores']} cores, torch {mach['torch']} on "
        f"{mach['device']} with {mach['torch_threads']} threads, Python {mach['python']}.",
        f"Pair: target {meta['target']} ({meta['dtype']}), drafter {meta['drafter']}, "
        f"pre-verifier {meta['preverifier']}. Greedy, {meta['max_new_tokens']} new tokens, "
        f"{repeats}, methods interleaved per prompt.", "",
        "tokens/s: per repeat, the workload's tokens over the summed wall time of its calls "
        "(prefill included); median over repeats. Time shares come from the engine's own timers "
        "(HF generate has none). Peak RSS: the process's peak during the method's calls, with "
        "every model loaded. Mean accepted length: tokens committed per verify round.", "",
        "## Methods", "",
        *(f"- `{n}`: {m['note']}" for n, m in results["methods"].items()),
        *(f"- `{n}`: {why}" for n, why in results["not_measured"].items()), "", "## Results", ""]
    for name, w in results["workloads"].items():
        lines += workload_table(name, w)
    lines += ["## Research claims", ""] + comparison_rows(results["claims"], goal=False)
    if results.get("fastest_lossless"):
        lines += ["", "## The fastest lossless method", "",
                  f"`{results['fastest_lossless']}`: the strict method of our engine with the "
                  "highest geometric mean of its tokens/s ratios to `ar` over the workloads."]
    goal_set = GOAL_SETS[results.get("goal_set", "pacer")]
    lines += ["", f"## Goals ({goal_set})", ""] + comparison_rows(results["goals"], goal=True)
    return "\n".join(lines) + "\n"
