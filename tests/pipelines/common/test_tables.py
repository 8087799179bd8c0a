"""The jobs' Ray datasets of a Parquet table: every row as pyarrow reads it, on Ray Data's first
Parquet reader, the caller's choice of reader left as it was."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.common.tables import read_dataset, write_table


def test_a_table_reads_whole_and_the_callers_reader_is_kept(ray_session, tmp_path, capsys):
    from ray.data import DataContext

    table = pa.table({"id": [f"r{i}" for i in range(30)], "x": list(range(30))})
    path = write_table(table, tmp_path / "rows.parquet")
    context = DataContext.get_current()
    before = context.use_datasource_v2
    rows = read_dataset(path).select_columns(["x"]).take_all()
    assert sorted(r["x"] for r in rows) == pq.read_table(path)["x"].to_pylist()
    assert context.use_datasource_v2 == before
    # the first reader's plan: one read, no listing step (the one that starts the footer actors)
    capsys.readouterr()
    read_dataset(path).explain()
    plan = capsys.readouterr().out
    assert "ReadParquet" in plan and "ListFiles" not in plan
