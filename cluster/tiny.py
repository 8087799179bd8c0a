"""``tiny:DIR/PART`` model references: tiny random models built on first use, for smoke tests.

``tiny:/tmp/specdec-tiny/target`` names the target that ``specdec.models.tiny.make_tiny_models``
writes under ``/tmp/specdec-tiny`` (with ``drafter`` and ``block-drafter`` beside it); the
directory is built once, under a file lock, by the process that builds the Serve application.
The result is a plain local path, so it serves only on the machine (or shared disk) it was
built on. Every other reference passes through unchanged.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

PREFIX = "tiny:"


def materialise(ref: str | None) -> str | None:
    if ref is None or not ref.startswith(PREFIX):
        return ref
    path = Path(ref.removeprefix(PREFIX)).expanduser().absolute()
    root = path.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "block-drafter").exists():
            from specdec.models.tiny import make_tiny_models

            make_tiny_models(root)
    if not path.exists():
        raise FileNotFoundError(f"{ref}: tiny models have target, drafter and block-drafter only")
    return str(path)
