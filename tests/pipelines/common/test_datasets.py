"""The prompt sources (pipelines.common.datasets): record-by-record decoding of a cut JSON array,
stable splits, exchanges."""

from __future__ import annotations

from pipelines.common.datasets import first_exchange, sharegpt_records, split_of


def test_records_stop_at_the_cut(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('[\n  {"id": "a", "conversations": []},\n  {"id": "b"},\n  {"id": "c", "conv')
    assert [r["id"] for r in sharegpt_records(path, 10)] == ["a", "b"]
    assert [r["id"] for r in sharegpt_records(path, 1)] == ["a"]


def test_split_is_a_stable_function_of_the_id():
    splits = [split_of(f"id{i}", 10, 10) for i in range(2000)]
    assert splits == [split_of(f"id{i}", 10, 10) for i in range(2000)]
    share = {s: splits.count(s) / len(splits) for s in ("train", "dev", "benchmark")}
    assert 0.07 < share["benchmark"] < 0.13 and 0.07 < share["dev"] < 0.13


def test_first_exchange_skips_leading_gpt_turns_and_empty_prompts():
    rec = {"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": " "},
                             {"from": "gpt", "value": "x"}, {"from": "human", "value": "q"},
                             {"from": "gpt", "value": "a"}]}
    assert first_exchange(rec) == ("q", "a")
    assert first_exchange({"conversations": [{"from": "human", "value": "q"}]}) is None
