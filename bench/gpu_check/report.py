"""The GPU check's report: stages run in order, each recorded, the JSON rewritten after each.

A *stage* is a named function of the shared context (``Context``) that returns a dict of
results. ``Report.run`` records its status (``ok``, ``failed`` or ``skipped``), wall time and
result, or its error and traceback, and writes the whole report at once (to a temporary file,
then renamed, so the file on disk is always whole JSON). A stage is skipped, with the reason,
when a stage it needs did not succeed or when the deadline has passed.

What it is not: no model code; the stages live in ``tiny``, ``model`` and ``training``.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_FILE = "gpu_check.json"


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Any], dict]  # context -> results (JSON-able)
    needs: tuple[str, ...] = ()  # stages that must have succeeded first
    reserve_s: float = 0.0  # skipped when less than this is left before the deadline


@dataclass
class Context:
    """What the stages share: the command's arguments, the output folder, the deadline (a
    ``time.monotonic`` value) and what earlier stages left for later ones (``keep``)."""

    args: Any
    out: Path
    deadline: float
    keep: dict = field(default_factory=dict)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()


class Report:
    def __init__(self, path: Path, header: dict):
        self.path = path
        self.data = {**header, "stages": {}}
        self.write()

    def run(self, stage: Stage, ctx: Context) -> dict:
        """Run ``stage`` (or skip it), record it, rewrite the file; -> its record."""
        reason = self.skip_reason(stage, ctx)
        if reason is not None:
            record = {"status": "skipped", "reason": reason}
        else:
            start = time.monotonic()
            try:
                result = stage.run(ctx)
                # a check that ran but found a fault (``passed`` False) fails, result kept
                status = "failed" if result.get("passed") is False else "ok"
                record = {"status": status, "result": result}
                if status == "failed":
                    record["error"] = "a check found a fault (result.passed is false)"
            except Exception as err:  # recorded; the stages that do not need this one go on
                record = {"status": "failed", "error": f"{type(err).__name__}: {err}",
                          "traceback": traceback.format_exc()}
            record["seconds"] = round(time.monotonic() - start, 2)
        self.data["stages"][stage.name] = record
        self.write()
        print(f"gpu_check: {stage.name}: {record['status']}"
              + (f" ({record['seconds']} s)" if "seconds" in record else "")
              + (f": {record.get('error') or record.get('reason')}"
                 if record["status"] != "ok" else ""), flush=True)
        return record

    def skip_reason(self, stage: Stage, ctx: Context) -> str | None:
        stages = self.data["stages"]
        missing = [n for n in stage.needs if stages.get(n, {}).get("status") != "ok"]
        if missing:
            return f"needs {', '.join(missing)}, which did not succeed"
        if ctx.left_s() < stage.reserve_s:
            return f"{ctx.left_s():.0f} s left before the deadline; the stage needs {stage.reserve_s:.0f}"
        return None

    def finish(self, **fields) -> None:
        self.data |= fields
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)
