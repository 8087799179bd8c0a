"""Offline replay of the suffix drafter against the target's real greedy outputs (a cheap
measure of accepted length, no timing).

With strict greedy verification a draft is accepted exactly as far as it matches the target's
greedy continuation, so the rounds of speculative decoding can be replayed from the greedy
output alone: each round the drafter proposes from prompt + output so far, the longest prefix
that matches the output is accepted, and one more (the bonus) token is committed. The drafter
is the engine's own ``SuffixDrafter`` (and ``NgramDrafter`` as the baseline, which checks the
replay against the engine benchmark's n-gram figure).

    python -m bench.suffix_replay --index DIR [--index DIR ...] --out FILE.json

The greedy outputs of the benchmark prompts (HumanEval/0..N-1 and a seeded ShareGPT choice,
as ``bench.engine`` picks them) are computed once with the plain engine and cached next
to ``--out``. Each row of the result: drafter, index size, online (the global tree grows with
the outputs replayed before, in order) or cold, and the mean accepted length per round.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.algorithms.sampling import Sampling
from specdec.engine.settings import SpecSettings, flat_knob
from specdec.knobs import add_option

GREEDY = Sampling(0.0, None)


def replay(drafter, prompt: list[int], output: list[int], limit: int) -> tuple[int, int]:
    """(rounds, drafted tokens) to commit ``output`` from ``prompt``; a round drafts at most
    ``limit`` tokens and never past the output's end."""
    state = drafter.start(prompt, None, **settings_kw(drafter))
    pos = rounds = drafted = 0
    while pos < len(output):
        room = min(limit, len(output) - pos - 1)
        draft = drafter.propose(state, room, GREEDY).tokens.tolist() if room > 0 else []
        accepted = 0
        while accepted < len(draft) and draft[accepted] == output[pos + accepted]:
            accepted += 1
        new = output[pos:pos + accepted + 1]
        drafter.commit(state, new, None)
        pos, rounds, drafted = pos + len(new), rounds + 1, drafted + len(draft)
    getattr(drafter, "finish", lambda s: None)(state)
    return rounds, drafted


def settings_kw(drafter) -> dict:
    spec = getattr(drafter, "replay_settings", None)
    return {"settings": spec} if spec is not None else {}


def greedy_outputs(prompts, target_ref: str, n: int, cache: Path) -> dict[str, list[int]]:
    if cache.is_file():
        return json.loads(cache.read_text())
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_pair
    from specdec.engine.settings import GenerationParams

    engine = Engine(load_pair(target_ref, "none").target)
    out = {p.id: engine.generate(p.ids, GenerationParams(max_new_tokens=n)).token_ids
           for p in prompts}
    cache.write_text(json.dumps(out))
    return out


def run_one(make, prompts, outputs, limit: int) -> dict:
    drafter = make()
    rounds = drafted = tokens = 0
    for p in prompts:
        r, d = replay(drafter, p.ids, outputs[p.id], limit)
        rounds, drafted, tokens = rounds + r, drafted + d, tokens + len(outputs[p.id])
    return {"mean_accepted_length": round(tokens / rounds, 3),
            "drafted_per_round": round(drafted / rounds, 2)}


def main(argv=None) -> None:
    from bench.config import BenchmarkConfig, load_prompts
    from specdec.models.ngram import NgramDrafter
    from specdec.models.suffix import SuffixConfig, SuffixDrafter
    from specdec.models.suffix_index import SuffixIndex

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--index", action="append", default=[], help="suffix index directories")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--count", type=int, default=40, help="prompts per workload")
    add_option(ap, *flat_knob("max_draft"), flag="max-draft", dest="max_draft")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    cfg = BenchmarkConfig(workloads={"humaneval": {"count": a.count}, "sharegpt": {"count": a.count}})
    prompts = load_prompts(cfg)
    outputs = greedy_outputs(prompts, a.target, a.max_new_tokens,
                             a.out.with_name(a.out.stem + "-greedy.json"))
    vocab = 49152
    indexes = [None, *[SuffixIndex.load(i) for i in a.index]]
    rows = []
    for workload in ("humaneval", "sharegpt"):
        ps = [p for p in prompts if p.workload == workload]
        base = {"workload": workload, "prompts": len(ps)}
        rows.append(base | {"drafter": "ngram gamma 4", "index": 0, "online": False}
                    | run_one(lambda: NgramDrafter(vocab), ps, outputs, 4))
        for index in indexes:
            for online in (False, True):
                for factor, min_prob in ((1.0, 0.1), (2.0, 0.05)):
                    spec = SpecSettings(max_draft=a.max_draft, suffix_factor=factor,
                                        suffix_min_prob=min_prob)

                    def make(index=index, online=online, spec=spec):
                        d = SuffixDrafter(vocab, SuffixConfig(online=online), index)
                        d.replay_settings = spec
                        return d

                    size = len(index.sequences) if index else 0
                    rows.append(base | {"drafter": f"suffix factor {factor:g} min_prob {min_prob:g}",
                                        "index": size, "index_tokens": index.num_tokens if index else 0,
                                        "online": online} | run_one(make, ps, outputs, a.max_draft))
                    print(json.dumps(rows[-1]), flush=True)
    a.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
