"""The responses job: batched, left-padded greedy generation reproduces the target's own greedy
decoding of every prompt, and the job writes a corpus the drafter job can read."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from pipelines import responses
from pipelines.common.formats import CORPUS_SCHEMA, tokenizer_fingerprint
from pipelines.common.tables import metadata, write_table
from specdec.models.target import TargetModel
from tests.conftest import greedy_reference
from tests.pipelines.conftest import config

TEXTS = [b"hello world, hello", b"def f(x):\n    return", b"ab", b"for i in range(3):\n  "]


@pytest.fixture(scope="module")
def prompts_corpus(tiny_llama, store):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama["target"])
    rows = [dict(id=f"p{i}", source="sharegpt", split="train", prompt_ids=list(t),
                 input_ids=list(t) + [1, 2, 3], prompt_len=len(t)) for i, t in enumerate(TEXTS)]
    path = store["root"] / "prompts" / "train.parquet"
    write_table(pa.Table.from_pylist(rows, schema=CORPUS_SCHEMA), path,
                {"specdec.tokenizer": tokenizer_fingerprint(tok)})
    return str(path)


def test_cut_at_eos():
    assert responses.cut_at_eos([5, 6, 2, 9, 2], frozenset({2}), pad=0) == [5, 6, 2]
    assert responses.cut_at_eos([5, 6, 0, 0], frozenset({2}), pad=0) == [5, 6]
    assert responses.cut_at_eos([], frozenset({2}), pad=0) == []


@pytest.mark.parametrize("backend", ["runtime", "transformers"])
def test_batched_responses_are_the_targets_greedy_decoding(tiny_llama, backend):
    target = TargetModel.from_pretrained(tiny_llama["target"], "float64", backend=backend)
    assert target.backend == backend
    prompts = [list(t) for t in TEXTS]  # lengths differ: ragged on the runtime, left-padded on HF
    got = responses.greedy_responses(target, prompts, max_new_tokens=12, batch_size=3,
                                     progress=False)
    for prompt, response in zip(prompts, got, strict=True):
        assert response == greedy_reference(target.model, prompt, 12, target.eos_token_ids)


def test_the_job_writes_a_corpus_of_prompt_plus_response(ray_session, tiny_llama, store,
                                                          prompts_corpus):
    out = store["root"] / "responses" / "train.parquet"
    cfg = config(responses.ResponsesConfig, store, target=tiny_llama["target"], dtype="float64",
                 corpus=prompts_corpus, out=str(out), max_new_tokens=6,
                 actors={"batch_size": 2, "num_cpus": 0.5})
    stats = responses.run(cfg)  # a pool of Ray actors over a Ray Dataset
    table = pq.read_table(out)
    assert table.schema.equals(CORPUS_SCHEMA, check_metadata=False)
    assert stats["rows"] == table.num_rows == len(TEXTS)
    for row in table.to_pylist():
        assert row["input_ids"][: row["prompt_len"]] == row["prompt_ids"]
        assert 1 <= len(row["input_ids"]) - row["prompt_len"] <= 6
    assert metadata(out)["specdec.responses"] == "target-greedy"


def test_a_time_limit_keeps_the_batches_done(tiny_llama, store, prompts_corpus):
    cfg = config(responses.ResponsesConfig, store, target=tiny_llama["target"],
                 corpus=prompts_corpus, out=str(store["root"] / "cut" / "train.parquet"),
                 max_new_tokens=4, actors={"batch_size": 1})
    stats = responses.run(cfg, offline=True, minutes=0.0)  # only the first batch starts
    assert (stats["rows"], stats["skipped_for_time"]) == (1, len(TEXTS) - 1)


def test_no_prompt_short_enough_is_a_clear_error(tiny_llama, store, prompts_corpus):
    cfg = config(responses.ResponsesConfig, store, target=tiny_llama["target"],
                 corpus=prompts_corpus, max_prompt_tokens=1)
    with pytest.raises(ValueError, match="no prompt of at most 1 tokens"):
        responses.run(cfg, offline=True)


def test_left_pad_puts_the_prompt_last():
    ids, mask = responses.left_pad([[7, 8, 9], [5]], pad=0, device="cpu")
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert ids.dtype == torch.long
