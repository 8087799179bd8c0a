"""The layering rule: specdec/ (the core) never imports ray; actors/ never import cluster/ or
pipelines/. Checked on the source with ast, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(package: str) -> dict[str, set[str]]:
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package: str, forbidden: set[str]) -> list[str]:
    return [f"{f}: {sorted(n & forbidden)}" for f, n in imported_modules(package).items()
            if n & forbidden]


def test_core_never_imports_ray_or_upper_layers():
    assert imported_modules("specdec"), "no core sources found"
    assert offenders("specdec", {"ray", "actors", "cluster", "pipelines"}) == []


def test_actors_do_not_import_the_serving_or_training_layers():
    assert offenders("actors", {"cluster", "pipelines"}) == []
