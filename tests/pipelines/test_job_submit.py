"""``ray job submit`` to a local cluster of our own (a head started for this test only, on free
ports, torn down by its process group): a small corpus job must succeed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not come up in {seconds} s")


@pytest.fixture()
def local_head(tmp_path):
    gcs, dash, client, agent, grpc, metrics, runtime_env = free_ports(7)
    temp = Path(f"/tmp/rj{os.getpid()}")  # short: Ray puts sockets under it
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={gcs}", "--num-cpus=1",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
         f"--dashboard-agent-grpc-port={grpc}", f"--metrics-export-port={metrics}",
         f"--runtime-env-agent-port={runtime_env}", f"--temp-dir={temp}"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{dash}/api/version", 90)
        yield f"http://127.0.0.1:{dash}", env
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head and the Ray processes it started
        try:
            head.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)  # only our own process group
            head.wait(timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_ray_job_submit_runs_the_corpus_job(local_head, tiny_llama, tmp_path):
    address, env = local_head
    cfg = tmp_path / "corpus.yaml"
    cfg.write_text(
        f"target: {tiny_llama['target']}\nout_dir: {tmp_path / 'corpus'}\n"
        "max_conversations: 10\nmax_tokens: 96\nmax_prompt_tokens: 440\nhumaneval_limit: 2\n"
        f"mlflow: {{tracking_uri: 'sqlite:///{tmp_path / 'mlflow.db'}'}}\n")
    done = subprocess.run(
        [RAY, "job", "submit", "--address", address, "--working-dir", str(ROOT), "--",
         sys.executable, "-m", "pipelines.corpus", "--config", str(cfg)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout + done.stderr
    assert (tmp_path / "corpus" / "train.parquet").is_file()
    # the suffix index job, on the same head, over the corpus rows (same schema as responses)
    index_cfg = tmp_path / "suffix_index.yaml"
    index_cfg.write_text(
        f"target: {tiny_llama['target']}\nresponses: {tmp_path / 'corpus' / 'train.parquet'}\n"
        f"out: {tmp_path / 'index'}\nmlflow: {{tracking_uri: 'sqlite:///{tmp_path / 'mlflow.db'}'}}\n")
    done = subprocess.run(
        [RAY, "job", "submit", "--address", address, "--working-dir", str(ROOT), "--",
         sys.executable, "-m", "pipelines.suffix_index", "--config", str(index_cfg)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "index" / "suffix_index.json").is_file()
