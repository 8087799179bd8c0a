"""The engine harness's journal: each timed call appended to a JSONL file as it completes, so
an interrupted run continues where it stopped. Its header is a fingerprint of what decides the
numbers (the config but its output and display fields, the prompt ids, each method's settings and
the model directories' contents); a journal of another fingerprint is set aside (``*.stale``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from pathlib import Path

from bench.methods import Record
from specdec.engine.stats import RequestStats
from specdec.models.sources import content_hash

IGNORED = {"out_dir", "quick_out_dir", "progress", "mlflow"}  # do not change the numbers


def fingerprint(config: dict, prompt_ids: list[str], inputs: dict | None = None) -> str:
    kept = {k: v for k, v in config.items() if k not in IGNORED}
    blob = json.dumps({"config": kept, "prompts": prompt_ids, "inputs": inputs or {}},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def inputs(methods: list, refs: dict[str, str | None]) -> dict:
    """What a config's paths stand for: method settings, local model directories' hashes."""
    models = {k: content_hash(Path(v)) if v and Path(v).is_dir() else v for k, v in refs.items()}
    return {"methods": {m.name: m.settings for m in methods}, "models": models}


def plain(obj) -> dict:
    """A dataclass's fields, one level deep (``dataclasses.asdict`` would garble a Counter)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def to_line(r: Record) -> str:
    stats = None if r.stats is None else plain(r.stats)
    return json.dumps({**plain(r), "stats": stats}) + "\n"


def from_line(line: str) -> Record:
    d = json.loads(line)
    d.pop("peak_rss_mb", None)  # journaled by an older harness
    if d["stats"] is not None:
        s = d["stats"]
        s["draft_lengths"] = Counter({int(k): v for k, v in s["draft_lengths"].items()})
        s["draft_sources"] = Counter(s.get("draft_sources", {}))
        d["stats"] = RequestStats(**s)
    return Record(**d)


class Journal:
    """Append-only record of the timed calls of one benchmark configuration."""

    def __init__(self, path: Path, key: str):
        self.path, self.key = Path(path), key
        self.done: dict[tuple[int, str, str], Record] = {}
        if self.path.exists():
            lines = self.path.read_text().splitlines()
            header = json.loads(lines[0]) if lines else {}
            if header.get("fingerprint") == key:
                for line in lines[1:]:
                    try:
                        r = from_line(line)
                    except (json.JSONDecodeError, KeyError, TypeError):
                        break  # a line cut by the interruption: redo that call
                    self.done[(r.repeat, r.prompt, r.method)] = r
            else:
                self.path.rename(self.path.with_suffix(".stale"))
        self.path.parent.mkdir(parents=True, exist_ok=True)  # rewritten: a cut last line goes
        self.path.write_text(json.dumps({"fingerprint": key}) + "\n"
                             + "".join(to_line(r) for r in self.done.values()))

    def get(self, repeat: int, prompt: str, method: str) -> Record | None:
        return self.done.get((repeat, prompt, method))

    def add(self, r: Record) -> None:
        self.done[(r.repeat, r.prompt, r.method)] = r
        with self.path.open("a") as f:
            f.write(to_line(r))
