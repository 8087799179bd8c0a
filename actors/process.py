"""What an actor reports about its own process: pid and resident memory, read from /proc (or
psutil where /proc is absent). Load tests use it to find leaks; fault tests to find the actor."""

from __future__ import annotations

import os
from pathlib import Path


def resident_bytes(pid: int | None = None) -> int:
    statm = Path(f"/proc/{pid or os.getpid()}/statm")
    if statm.is_file():
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    import psutil

    return psutil.Process(pid).memory_info().rss


def process_info() -> dict:
    return {"pid": os.getpid(), "rss_bytes": resident_bytes()}
