"""The GPU check's report: each stage (a named function of the shared ``Context`` returning a
dict) recorded as ``ok``, ``failed`` (its error and traceback; ``passed`` False in its result
fails it too) or ``skipped`` (a stage it needs did not succeed, or the deadline is too near), the
whole report rewritten after each. No model code: the stages live in ``tiny``, ``model`` and
``training``.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import write

REPORT_FILE = "gpu_check.json"


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Any], dict]  # context -> results (JSON-able)
    needs: tuple[str, ...] = ()  # stages that must have succeeded first
    reserve_s: float = 0.0  # skipped when less than this is left before the deadline


@dataclass
class Context:
    """The arguments, the output folder, the deadline (``time.monotonic``) and what earlier
    stages left for later ones (``keep``)."""

    args: Any
    out: Path
    deadline: float
    keep: dict = field(default_factory=dict)

    def left_s(self) -> float:
        return self.deadline - time.monotonic()


class Report:
    def __init__(self, path: Path, header: dict):
        self.path, self.data = path, {**header, "stages": {}}
        self.write()

    def run(self, stage: Stage, ctx: Context) -> dict:
        """Run ``stage`` (or skip it), record it, rewrite the file; -> its record."""
        done = self.data["stages"]
        missing = [n for n in stage.needs if done.get(n, {}).get("status") != "ok"]
        if missing or ctx.left_s() < stage.reserve_s:
            reason = (f"needs {', '.join(missing)}, which did not succeed" if missing else
                      f"{ctx.left_s():.0f} s left before the deadline; the stage needs "
                      f"{stage.reserve_s:.0f}")
            record = {"status": "skipped", "reason": reason}
        else:
            start = time.monotonic()
            try:
                result = stage.run(ctx)
                record = {"status": "ok", "result": result}
                if result.get("passed") is False:
                    record |= {"status": "failed",
                               "error": "a check found a fault (result.passed is false)"}
            except Exception as err:  # recorded; the stages that do not need this one go on
                record = {"status": "failed", "error": f"{type(err).__name__}: {err}",
                          "traceback": traceback.format_exc()}
            record["seconds"] = round(time.monotonic() - start, 2)
        done[stage.name] = record
        self.write()
        print(f"gpu_check: {stage.name}: {record['status']}"
              + (f" ({record['seconds']} s)" if "seconds" in record else "")
              + (f": {record.get('error') or record.get('reason')}"
                 if record["status"] != "ok" else ""), flush=True)
        return record

    def finish(self, **fields) -> None:
        self.data |= fields
        self.write()

    def write(self) -> None:
        write(self.path.parent, self.path.stem, self.data, indent=1)
