"""Job: export a trained drafter + pre-verifier as the committed default pair.

    python -m pipelines.export_default --drafter DIR --preverifier DIR \
        [--pacer-defaults FILE] [--acceptance DIR] [--provenance-extra JSON_FILE] \
        --out artifacts/smollm2-135m

Writes ``OUT/drafter/`` and ``OUT/preverifier/`` (the models' own file layout, floating-point
tensors cast to bfloat16, integer buffers such as the drafter's ``draft_to_target`` unchanged),
``OUT/pacer_defaults.json`` when given, ``OUT/acceptance-<drafter>/`` (an acceptance model,
``specdec.models.acceptance``, as ``make serve`` registers it) when given, and
``OUT/provenance.json``: what the checkpoints say
about themselves (configs, target, step and loss when the drafter is a training checkpoint),
the git commit, this command, and every key of the extra JSON the caller passes (the training
chain's wall times, configs and MLflow metrics; see ``pipelines.train_default``). Nothing is
invented: a fact that no source gives is absent.

Everything is written to a temporary directory next to OUT and renamed into place only when
the total is within the size limit (30 MB: the pair is committed to git), so a refusal or a
crash leaves OUT as it was. ``BlockDrafter.load`` / ``PreVerifier.load`` cast the bfloat16
weights back to the target's dtype, so the exported pair serves a float32 target unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pipelines.common.tracking import git_state
from specdec.engine.settings import SpecSettings
from specdec.models.acceptance import ACCEPTANCE_FILE, AcceptanceModel
from specdec.models.block_drafter import CONFIG_FILE as DRAFTER_CONFIG
from specdec.models.block_drafter import BlockDrafter
from specdec.models.preverifier import CONFIG_FILE as PREVERIFIER_CONFIG
from specdec.models.registry import resolve_model_ref

LIMIT_BYTES = 30 * 10**6  # the whole exported directory, provenance included
PROVENANCE = "provenance.json"
PACER_DEFAULTS = "pacer_defaults.json"


def to_bfloat16(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Floating-point tensors to bfloat16; integer and boolean tensors unchanged."""
    return {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
            for k, v in state.items()}


def copy_as_bfloat16(src: Path, dst: Path) -> None:
    """Copy a model directory; every ``*.safetensors`` file is rewritten in bfloat16."""
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        out = dst / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors":
            save_file(to_bfloat16(load_file(path)), out)
        else:
            shutil.copy2(path, out)


def checked_dir(ref: str, kind: str) -> Path:
    """A local checkpoint directory of ``kind`` (``models:/`` references are downloaded)."""
    path = Path(resolve_model_ref(ref))
    ok = {"drafter": BlockDrafter.is_checkpoint,
          "acceptance": AcceptanceModel.is_checkpoint}.get(
        kind, lambda p: (p / PREVERIFIER_CONFIG).is_file())(path)
    if not ok:
        article = "an" if kind[0] in "aeiou" else "a"
        raise FileNotFoundError(f"--{kind} {ref}: not {article} {kind} checkpoint directory")
    return path


def drafter_facts(ref: str, path: Path) -> dict:
    """The drafter's config and target; step and loss when it sits in a training checkpoint
    (``checkpoints/step_N/drafter`` next to ``state.json``)."""
    meta = json.loads((path / DRAFTER_CONFIG).read_text())
    facts = {"source": ref, "target": meta.get("target"), "config": meta["config"]}
    state = path.parent / "state.json"
    if state.is_file():
        facts["checkpoint"] = json.loads(state.read_text())
    return facts



def read_pacer_defaults(path: str | Path) -> dict:
    """A PACER setting as ``pipelines.evaluate`` logs it; checked by the core's SpecSettings."""
    settings = json.loads(Path(path).read_text())
    SpecSettings(**settings)
    if settings.get("policy") != "pacer":
        raise ValueError(f"{path}: pacer defaults must have policy 'pacer', got {settings}")
    return settings


def file_table(root: Path) -> dict[str, dict]:
    return {p.relative_to(root).as_posix(): {"bytes": p.stat().st_size,
                                             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
            for p in sorted(root.rglob("*")) if p.is_file()}


def total_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def replace_dir(new: Path, out: Path) -> None:
    """Move ``new`` to ``out``, replacing any previous export."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{time.time_ns()}")
        out.rename(old)
        new.rename(out)
        shutil.rmtree(old)
    else:
        new.rename(out)


def export(drafter: str, preverifier: str, out: str | Path, pacer_defaults: str | None = None,
           extra: dict | None = None, limit_bytes: int = LIMIT_BYTES,
           command: list[str] | None = None, acceptance: str | None = None) -> Path:
    out = Path(out).absolute()
    drafter_dir, pre_dir = checked_dir(drafter, "drafter"), checked_dir(preverifier, "preverifier")
    pacer = read_pacer_defaults(pacer_defaults) if pacer_defaults else None
    accepting = None
    if acceptance:
        accepting = checked_dir(acceptance, "acceptance")
        config = json.loads((accepting / ACCEPTANCE_FILE).read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        copy_as_bfloat16(drafter_dir, tmp / "drafter")
        copy_as_bfloat16(pre_dir, tmp / "preverifier")
        if pacer is not None:
            (tmp / PACER_DEFAULTS).write_text(json.dumps(pacer, indent=2) + "\n")
        if accepting is not None:
            copy_as_bfloat16(accepting, tmp / f"acceptance-{config['drafter']}")
            extra = {**(extra or {}), "acceptance": {"source": acceptance, "config": config}}
        facts = drafter_facts(drafter, drafter_dir)
        provenance = {**(extra or {}),
                      "target": facts["target"], "drafter": facts,
                      "preverifier": {"source": preverifier, "config": json.loads(
                          (pre_dir / PREVERIFIER_CONFIG).read_text())},
                      "pacer_defaults": pacer,
                      "weights": "floating-point tensors bfloat16, integer buffers unchanged",
                      "files": file_table(tmp), "git": git_state(),
                      "export_command": command or sys.argv,
                      "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")
        size = total_bytes(tmp)
        if size > limit_bytes:
            raise ValueError(f"the exported pair is {size / 1e6:.2f} MB, over the limit of "
                             f"{limit_bytes / 1e6:.2f} MB; {out} is left unchanged")
        replace_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Export the default pair as bfloat16 safetensors.")
    ap.add_argument("--drafter", required=True, help="block-drafter directory or models:/ ref")
    ap.add_argument("--preverifier", required=True, help="pre-verifier directory or models:/ ref")
    ap.add_argument("--pacer-defaults", help="pacer_defaults.json from pipelines.evaluate")
    ap.add_argument("--acceptance", help="an acceptance-model directory or models:/ ref")
    ap.add_argument("--provenance-extra", help="a JSON object merged into provenance.json")
    ap.add_argument("--out", required=True, help="e.g. artifacts/smollm2-135m")
    ap.add_argument("--max-mb", type=float, default=LIMIT_BYTES / 1e6)
    a = ap.parse_args(argv)
    extra = json.loads(Path(a.provenance_extra).read_text()) if a.provenance_extra else None
    if extra is not None and not isinstance(extra, dict):
        raise ValueError(f"--provenance-extra {a.provenance_extra} must hold a JSON object")
    command = [sys.executable, "-m", "pipelines.export_default", *(argv or sys.argv[1:])]
    out = export(a.drafter, a.preverifier, a.out, a.pacer_defaults, extra, int(a.max_mb * 1e6),
                 command, a.acceptance)
    print(f"exported: {out} ({total_bytes(out) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
