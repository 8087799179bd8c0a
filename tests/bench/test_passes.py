"""The passes harness (bench/passes.py) on the tiny pair: arms loaded through ``load_target``,
every pass and prefill timed in each arm in turn, the logit gap between them, the table; plain
decoding alone and beside a busy process, each arm's OpenMP variables in a process of its own."""

from __future__ import annotations

import json

from bench.passes import Passes, main, sweep, table
from specdec.engine.loading import load_target


def test_two_arms_of_the_same_target_time_every_pass_with_no_logit_gap(tiny_llama):
    arms = {name: Passes(load_target(tiny_llama["target"], kv_slots=3), 2, 16)
            for name in ("a", "b")}
    result = sweep(arms, ((1, 1), (2, 3)), (8,), repeats=2, warm=1)
    rows = result["passes_ms"] + result["prefill_ms"]
    assert [(r.get("B"), r.get("T"), r.get("tokens")) for r in rows] == [
        (1, 1, None), (2, 3, None), (None, None, 8)]
    assert all(r["a"] > 0 and r["b"] > 0 and r["max_logit_gap"] == 0 for r in rows)
    assert [s.length for s in arms["a"].states] == [16, 16]  # every pass cropped back
    lines = table(result, ["a", "b"], 16)
    assert lines[2] == "| pass | a | b | b / a | max logit gap |"
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| 1 x 1", "| 2 x 3", "| prefill 8"]


def test_a_pass_feeds_each_running_request_its_tokens_beside_a_prompt(tiny_llama):
    passes = Passes(load_target(tiny_llama["target"], kv_slots=4), 3, 5)
    passes.time([1, 0, 2], prompt=4)
    assert [out.logits.shape[0] for out in passes.last] == [1, 1, 2]  # the prefill's last only
    assert [s.length for s in passes.states] == [5, 5, 5]


def test_each_neighbour_arm_runs_in_a_process_started_with_its_openmp_environment(tiny_llama,
                                                                                  tmp_path):
    """``--neighbour`` on the tiny target, one thread, the smallest run: each arm's process has
    its own variables from the start, and OpenMP took them (an active one spins while the
    process sleeps, a passive one does not); both rates of every arm, and the report."""
    main(["--neighbour", "--target", tiny_llama["target"], "--threads", "1", "--tokens", "2",
          "--repeats", "1", "--context", "4", "--out", str(tmp_path),
          "--arm", 'passive={"OMP_WAIT_POLICY": "PASSIVE"}',
          "--arm", 'active={"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "100000000"}'])
    rows = {r["arm"]: r for r in json.loads((tmp_path / "neighbour.json").read_text())["rows"]}
    assert rows["passive"]["omp"] == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": None}
    assert rows["active"]["omp"]["OMP_WAIT_POLICY"] == "ACTIVE"
    assert rows["active"]["spin_ms"] > max(5.0, 10 * rows["passive"]["spin_ms"])
    for r in rows.values():
        assert len(r["alone"]) == len(r["beside"]) == 1 and r["alone_tok_s"] > 0
        assert r["ratio"] == round(r["beside_tok_s"] / r["alone_tok_s"], 3)
    md = (tmp_path / "neighbour.md").read_text().splitlines()
    assert [line.split(" | ")[0] for line in md[4:]] == ["| passive", "| active"]
