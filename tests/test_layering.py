"""The layering rule, one direction only (docs/DESIGN.md):

    bench/                 benchmarks: may import everything below; nothing imports it
    cluster/  pipelines/   serving | training jobs: never import each other
    actors/                plain classes holding models: never import cluster/ or pipelines/
    specdec/               the core: never imports ray or any layer above it

Inside ``pipelines/`` the helpers (``pipelines/common/``) never import a job, a job imports no
other job (the job table and the chain runner aside), and the benchmarks import only those
helpers, never a job, except the GPU check, which runs the jobs' own steps on the device
(``JOB_STEPS``). Checked on the source with ast, so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("specdec", "actors", "cluster", "pipelines", "bench")


def dotted_imports(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports (``from a.b import c`` gives ``a.b`` and
    ``a.b.c``: ``c`` may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def imported_modules(package: str) -> dict[str, set[str]]:
    """Source file -> the dotted names it imports, for every file under ``package``."""
    return {str(path.relative_to(ROOT)): dotted_imports(path)
            for path in (ROOT / package).rglob("*.py")}


def top_level(names: set[str]) -> set[str]:
    return {n.split(".")[0] for n in names}


def offenders(package: str, forbidden: set[str]) -> list[str]:
    """Files under ``package`` that import a top-level package in ``forbidden``."""
    return [f"{f}: {sorted(top_level(n) & forbidden)}"
            for f, n in imported_modules(package).items() if top_level(n) & forbidden]


def pipeline_jobs() -> set[str]:
    """``pipelines.NAME`` for every module directly in pipelines/ (the jobs, the job table and
    the chain runner; not ``pipelines.common``)."""
    return {f"pipelines.{p.stem}" for p in (ROOT / "pipelines").glob("*.py")
            if p.stem != "__init__"}


def job_importers(package: str) -> list[str]:
    jobs = pipeline_jobs()
    return [f"{f}: {sorted(n & jobs)}" for f, n in imported_modules(package).items() if n & jobs]


def test_every_layer_has_sources():
    for layer in LAYERS:
        assert imported_modules(layer), f"no sources found under {layer}/"
    assert imported_modules("pipelines/common")


def test_core_never_imports_ray_or_upper_layers():
    assert offenders("specdec", {"ray", "actors", "cluster", "pipelines", "bench"}) == []


def test_actors_do_not_import_the_serving_training_or_benchmark_layers():
    assert offenders("actors", {"cluster", "pipelines", "bench"}) == []


def test_serving_never_imports_the_jobs_or_the_benchmarks():
    assert offenders("cluster", {"pipelines", "bench"}) == []


def test_jobs_never_import_serving_or_the_benchmarks():
    assert offenders("pipelines", {"cluster", "bench"}) == []


def test_job_helpers_never_import_a_job():
    assert job_importers("pipelines/common") == []


def test_a_job_imports_no_other_job():
    """Only the job table (``jobs``) and the chain runner (``train_default``) name other jobs."""
    jobs, runners = pipeline_jobs(), {"pipelines/jobs.py", "pipelines/train_default.py"}
    crossing = []
    for f, names in imported_modules("pipelines").items():
        others = names & jobs - {f.removesuffix(".py").replace("/", ".")}
        if f not in runners and others:
            crossing.append(f"{f}: {sorted(others)}")
    assert crossing == []


# The GPU check (bench/gpu_check/) runs the jobs' own steps on the device: 20 steps of each
# trainer's code and the responses job's greedy generation.
JOB_STEPS = {"pipelines.train_drafter", "pipelines.train_preverifier", "pipelines.responses"}


def test_benchmarks_import_job_helpers_not_jobs():
    jobs = pipeline_jobs()
    found = [(f, n & jobs) for f, n in imported_modules("bench").items() if n & jobs]
    assert [f for f, names in found
            if not (f.startswith("bench/gpu_check/") and names <= JOB_STEPS)] == []


def test_the_checks_see_a_lazy_crossing(tmp_path):
    """The ast walk finds an import inside a function body, the form a crossing usually takes."""
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from cluster.app import build_app\n    import bench.engine\n")
    assert top_level(dotted_imports(source)) == {"cluster", "bench"}
