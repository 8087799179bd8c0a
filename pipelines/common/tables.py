"""Parquet I/O with schema checks: a missing file, a file that is not Parquet, or a missing or
mistyped column fails with the file and the column named, before any long work starts; and the
jobs' one way to read a table as a Ray dataset (``read_dataset``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def read_table(path: str | Path, schema: pa.Schema, what: str) -> pa.Table:
    """The file's ``schema`` columns, once ``check_table`` has passed."""
    return pq.read_table(check_table(path, schema, what), columns=schema.names)


def check_table(path: str | Path, schema: pa.Schema, what: str) -> Path:
    """``path`` if it is a Parquet file with ``schema``'s columns and types (its footer alone is
    read); else the error naming ``what``, the file and the column."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what}: Parquet file {path} does not exist")
    try:
        found = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{what}: {path} is not a readable Parquet file ({err})") from None
    for field in schema:
        if field.name not in found.names:
            raise ValueError(f"{what}: {path} has no column {field.name!r} "
                             f"(columns: {found.names})")
        got = found.field(field.name).type
        if not got.equals(field.type):
            raise ValueError(f"{what}: column {field.name!r} of {path} is {got}, "
                             f"expected {field.type}")
    return path


def read_dataset(path: str | Path):
    """``ray.data.read_parquet(path)`` through Ray Data's first Parquet reader. Its
    second starts a pool of 32 actors per read to read the files' footers (Ray's
    ``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS``), each a process of its own: on a small node those
    starts cost minutes where our tables of a few files read in a second."""
    from ray.data import DataContext, read_parquet

    context = DataContext.get_current()
    second = context.use_datasource_v2
    context.use_datasource_v2 = False  # read when the plan is made, here: the caller's is kept
    try:
        return read_parquet(str(path))
    finally:
        context.use_datasource_v2 = second


def metadata(path: str | Path) -> dict[str, str]:
    meta = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items()}


def write_table(table: pa.Table, path: str | Path, meta: dict[str, str] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if meta:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    pq.write_table(table, path)
    return path
