"""A Ray cluster of three nodes on this machine (``ray.cluster_utils.Cluster``, Ray's own test
tool: one raylet per node): a head that runs no replica, and two workers, ``node_a`` and
``node_b``, each offering one ``worker`` resource.

- Two Serve replicas of the tiny pair, whose targets each ask for a ``worker``: each replica's
  placement group (replica, target, drafter: ``cluster.placement``) lies whole on one worker
  node (STRICT_PACK), one replica per node, and every output equals the engine's.
- A Ray Data pipeline (``pipelines.simulate``'s actor class through ``map_prompts``) whose blocks
  run on both worker nodes, with the rows of a one-process run.
- Data-parallel training of the pre-verifier and the drafter with two gloo workers, each asking
  for a node's one ``trainer`` resource, so one on each worker node: the same losses as one
  worker, and the same after losing a worker (tests/pipelines/test_data_parallel.py).
- Losing a node under load (last, since it removes ``node_b``): a spare worker ``node_c`` joins,
  ``node_b`` is killed mid-stream; its requests end (none hangs) and succeed on a retry, ``node_a``'s
  are unaffected, Serve places the lost replica whole on ``node_c``, and a load after it has no
  error.

The module replaces the session's one-node cluster (tests/conftest.py ``ray_cluster``) with its
own, so it runs last (``multinode`` marker, ordered in tests/conftest.py).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
import requests

from tests.cluster.conftest import free_port
from tests.pipelines.test_train_drafter import tiny_corpus  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

WORKERS = ("node_a", "node_b")
PROMPTS = ["hello world hello world, hello", "def f(x):\n    return x + 1\n\ndef g(", "a b a b a",
           "the cat sat on the", "1, 2, 3, 4,", "x = [", "hello hello", "zzz"]


def add_worker(cluster, name: str):
    """A worker node of 3 CPUs offering one ``name``, one ``worker`` and one ``trainer``."""
    with pytest.MonkeyPatch.context() as env:
        # no idle workers started ahead on each raylet: on two cores they slow the start down
        env.setenv("RAY_enable_worker_prestart", "0")
        env.setenv("RAY_prestart_worker_first_driver", "0")
        return cluster.add_node(num_cpus=3, resources={name: 1, "worker": 1, "trainer": 1})


@pytest.fixture(scope="module")
def cluster_nodes():
    """The cluster (``ray.cluster_utils.Cluster``) and {name: node} of its two worker nodes;
    the driver is connected to it."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 token auth (docs/DESIGN.md)
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # the session's cluster: every test that used it has run
        serve.shutdown()
        ray.shutdown()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_enable_worker_prestart", "0")  # as in add_worker
        env.setenv("RAY_prestart_worker_first_driver", "0")
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                                "include_dashboard": True})
    workers = {name: add_worker(cluster, name) for name in WORKERS}
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster, workers
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def nodes(cluster_nodes):
    """{name: node id} of the two worker nodes."""
    return {name: node.node_id for name, node in cluster_nodes[1].items()}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    from cluster.tiny import materialise

    root = tmp_path_factory.mktemp("multinode-tiny")
    return {"target": materialise(f"tiny:{root}/target"),
            "drafter": materialise(f"tiny:{root}/block-drafter")}


@pytest.fixture(scope="module")
def served(nodes, tiny_dirs):
    from ray import serve

    from cluster.app import build_app

    port = free_port()
    # one HTTP proxy: proxies on every node would all bind this port of this one machine
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app({
        "target": tiny_dirs["target"], "drafter": tiny_dirs["drafter"], "model_id": "tiny",
        "dtype": "float64", "num_replicas": 2,
        "target_resources": {"num_cpus": 0.5, "resources": {"worker": 1}},
        "drafter_resources": {"num_cpus": 0.5}, "server_num_cpus": 0.25,
        "limits": {"max_tokens": 64, "max_concurrent_requests": 8},
    }), name="specdec-multinode", route_prefix="/")
    return f"http://127.0.0.1:{port}"


def actor_tasks_per_node() -> dict[str, int]:
    """How many calls the target actors have run on each node."""
    from ray.util.state import list_tasks

    tasks = list_tasks(filters=[("type", "=", "ACTOR_TASK")], detail=True, limit=10_000,
                       raise_on_missing_output=False)
    counts: dict[str, int] = {}
    for task in tasks:
        if task.name.startswith("TargetActor.") and task.node_id:
            counts[task.node_id] = counts.get(task.node_id, 0) + 1
    return counts


def replica_groups() -> dict[str, list]:
    """The alive actors of each placement group (a replica's: its replica, target, drafter)."""
    from ray.util.state import list_actors

    groups: dict[str, list] = {}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=10_000):
        if actor.placement_group_id:
            groups.setdefault(actor.placement_group_id, []).append(actor)
    return groups


def replica_nodes() -> dict[str, str]:
    """{node id: its replica's three kinds of actors} of the groups whose actors share a node."""
    placed = {}
    for actors in replica_groups().values():
        if len({a.node_id for a in actors}) == 1:
            placed[actors[0].node_id] = ",".join(sorted(a.class_name.split(":")[0]
                                                        for a in actors))
    return placed


def test_each_replica_and_its_actors_share_one_worker_node(served, nodes):
    """The replicas' placement groups: one per worker node, each holding its replica, target and
    drafter actors, all alive on that node."""
    groups = replica_groups()
    assert len(groups) == 2
    for actors in groups.values():
        kinds = sorted(a.class_name.split(":")[0] for a in actors)
        assert kinds == ["DrafterActor", "ServeReplica", "TargetActor"]
        assert len({a.node_id for a in actors}) == 1, [(a.class_name, a.node_id) for a in actors]
    assert set(replica_nodes()) == set(nodes.values())


def engine_tokens(tiny_dirs, prompts: list[str], n: int) -> dict[str, list[int]]:
    """Each prompt's greedy tokens from the single-process engine on the same pair."""
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_pair
    from specdec.engine.settings import GenerationParams

    pair = load_pair(tiny_dirs["target"], tiny_dirs["drafter"], dtype="float64")
    engine, tokenizer = Engine(pair.target, pair.drafter), pair.target.tokenizer
    return {p: engine.generate(tokenizer(p)["input_ids"], GenerationParams(n)).token_ids
            for p in prompts}


def test_both_replicas_answer_as_the_engine_does(served, nodes, tiny_dirs):
    """Greedy completions sent at once reach both nodes' targets, each equals the engine's, and
    once they are done neither replica's actors hold a request."""
    reference = engine_tokens(tiny_dirs, PROMPTS, 24)
    before = actor_tasks_per_node()

    def complete(prompt: str) -> list[int]:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 24}
        reply = requests.post(f"{served}/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]

    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(complete, PROMPTS * 2))
    for prompt, tokens in zip(PROMPTS * 2, outputs, strict=True):
        assert tokens == reference[prompt], prompt
    deadline = time.monotonic() + 30  # task events reach the state API within a few seconds
    while True:
        after = actor_tasks_per_node()
        grew = {n for n in nodes.values() if after.get(n, 0) > before.get(n, 0)}
        if grew == set(nodes.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert grew == set(nodes.values()), (before, after)
    assert_replicas_idle(served)


def assert_replicas_idle(url: str) -> None:
    """Both replicas (told apart by their header on ``/debug/active``) report no request on
    their target and drafter actors within a minute."""
    from cluster.server import REPLICA_HEADER

    idle = {"target": [], "drafter": []}
    seen, deadline = {}, time.monotonic() + 60
    while time.monotonic() < deadline:
        reply = requests.get(f"{url}/debug/active", timeout=30)
        seen[reply.headers[REPLICA_HEADER]] = reply.json()
        if len(seen) == 2 and all(s == idle for s in seen.values()):
            return
        time.sleep(0.05)
    raise AssertionError(f"replicas not both idle: {seen}")


def simulate_config(tiny_dirs, size: int) -> dict:
    from pipelines.simulate import SimulateConfig

    return SimulateConfig(target=tiny_dirs["target"], drafter=tiny_dirs["drafter"],
                          prompts="in-memory", dtype="float64", max_new_tokens=8,
                          actors={"size": size, "num_cpus": 1.5}).model_dump()


class NodeSimulator:
    """``pipelines.simulate.Simulator`` with the id of the node each block ran on in its rows."""

    def __init__(self, config: dict, drafter_dir: str):
        from pipelines.simulate import Simulator

        self.simulator = Simulator(config, drafter_dir)

    def __call__(self, batch: pa.Table) -> pa.Table:
        import ray

        rows = self.simulator(batch)
        node = ray.get_runtime_context().get_node_id()
        return rows.append_column("node", pa.array([node] * rows.num_rows, pa.string()))


def test_data_pipeline_runs_blocks_on_both_worker_nodes(served, nodes, tiny_dirs):
    """Two simulation actors of 1.5 CPUs: with a replica's 1.25 CPUs on each 3-CPU worker and 1
    CPU on the head, one fits on each worker node. Their rows are those of one process."""
    import ray.data

    from pipelines.common.formats import STEPS_SCHEMA
    from pipelines.common.pools import ActorSettings, map_prompts
    from pipelines.simulate import Simulator
    from specdec.engine.loading import load_pair

    tokenizer = load_pair(tiny_dirs["target"], tiny_dirs["drafter"], dtype="float64").target.tokenizer
    rows = [{"id": f"p{i}", "prompt_ids": tokenizer(p)["input_ids"]} for i, p in enumerate(PROMPTS)]
    config = simulate_config(tiny_dirs, size=2)
    schema = STEPS_SCHEMA.append(pa.field("node", pa.string()))
    context = ray.data.DataContext.get_current()
    # blocks go to the actors that are up: start both before the first block, or the first one
    # up may take them all
    waited, context.wait_for_min_actors_s = context.wait_for_min_actors_s, 120
    try:
        table = map_prompts(rows, NodeSimulator, {"config": config,
                                                  "drafter_dir": tiny_dirs["drafter"]},
                            ActorSettings(size=2, num_cpus=1.5), schema)
    finally:
        context.wait_for_min_actors_s = waited
    assert set(table.column("node").to_pylist()) == set(nodes.values())
    local = Simulator(simulate_config(tiny_dirs, size=1), tiny_dirs["drafter"])(pa.Table.from_pylist(rows))
    served_rows = table.drop_columns(["node"]).to_pylist()
    assert len(served_rows) == local.num_rows > 0
    assert sorted(map(str, served_rows)) == sorted(map(str, local.to_pylist()))


def train_worker_nodes() -> set[str]:
    """The nodes every Ray Train worker so far ran on."""
    from ray.util.state import list_actors

    return {a.node_id for a in list_actors(detail=True, limit=10_000)
            if a.class_name.split(":")[0] == "RayTrainWorker"}


def test_training_two_workers_on_two_nodes_train_as_one(nodes, store, tiny_llama,
                                                        tiny_corpus):  # noqa: F811
    """Both jobs' two-worker runs place a worker on each worker node (one ``trainer`` each)."""
    from tests.pipelines.test_data_parallel import (
        run_drafter_pair,
        run_preverifier_pair,
        two_workers,
    )

    scaling = two_workers(resources_per_worker={"trainer": 1})
    run_preverifier_pair(store, store["root"] / "multinode-preverifier", scaling)
    assert train_worker_nodes() == set(nodes.values())
    run_drafter_pair(store, tiny_llama, tiny_corpus, store["root"] / "multinode-drafter", scaling)
    assert train_worker_nodes() == set(nodes.values())


# ---- losing a node under load (last: it removes node_b) ----------------------------------------

SPARE = "node_c"
STREAM_TOKENS = 64  # the served limit: the longest streams, so a kill lands mid-stream
BOUND_S = 60  # no request, and not the replica's return, may take longer
# How a request cut by the node's loss may end (never a read timeout: a hang). The replica dies
# with the node, so no in-band event comes: Serve's proxy closes the connection mid-body (an
# incomplete chunked body: ChunkedEncodingError), as seen in every run. Allowed too, by the
# race: a request routed to the dead replica before the proxy saw it die gets an HTTP error,
# and a replica that outlives its actors for a moment sends an in-band server_error.
CUT = {"server_error", "ChunkedEncodingError", "ConnectionError", "HTTP 500", "HTTP 503"}


@dataclass
class Attempt:
    """One streamed completion as its client saw it."""

    prompt: str
    started: float
    ended: float = 0.0
    replica: int | None = None  # the x-specdec-replica header: the replica's process id
    tokens: list[int] = field(default_factory=list)
    error: str | None = None  # the in-band error's type, "HTTP <status>", or the client's error
    done: bool = False  # the stream ended with data: [DONE]


def stream(url: str, prompt: str, on_chunk=None) -> Attempt:
    """Stream a greedy completion; ``on_chunk(attempt)`` after each chunk of tokens."""
    from cluster.server import REPLICA_HEADER

    attempt = Attempt(prompt, time.monotonic())
    body = {"model": "tiny", "prompt": prompt, "max_tokens": STREAM_TOKENS, "stream": True}
    try:  # every read waits 30 s at most: a hang ends as a timeout
        with requests.post(f"{url}/v1/completions", json=body, stream=True,
                           timeout=(10, 30)) as reply:
            if REPLICA_HEADER in reply.headers:
                attempt.replica = int(reply.headers[REPLICA_HEADER])
            if reply.status_code != 200:
                attempt.error = f"HTTP {reply.status_code}"
            for line in reply.iter_lines() if reply.status_code == 200 else ():
                if not line.startswith(b"data: "):
                    continue
                if line == b"data: [DONE]":
                    attempt.done = True
                    break
                event = json.loads(line[6:])
                if "error" in event:
                    attempt.error = event["error"]["type"]
                    continue
                attempt.tokens += event["choices"][0]["token_ids"]
                if on_chunk is not None:
                    on_chunk(attempt)
    except requests.RequestException as e:
        timed_out = isinstance(e, requests.Timeout) or "timed out" in str(e).lower()
        attempt.error = "timeout" if timed_out else type(e).__name__
    attempt.ended = time.monotonic()
    return attempt


def ok(attempt: Attempt) -> bool:
    return attempt.done and attempt.error is None


@pytest.mark.timeout(300)  # its own bounds end it sooner: this only guards them
def test_losing_a_node_under_load(cluster_nodes, served, nodes, tiny_dirs):
    """Eight clients stream completions in a loop over both replicas; once one is mid-stream on
    node_b's replica, node_b is killed (its raylet and every process on it, SIGKILL). Each
    request on node_b ends, none hangs, and each client retries a cut request; every request on
    node_a's replica, and every retry, gets the engine's tokens. Serve replaces the lost replica
    with one whose placement group lies on the spare node_c, which then holds a whole replica,
    and 16 requests sent 8 at a time after it all succeed."""
    from ray import serve
    from ray.util.state import list_actors

    cluster, workers = cluster_nodes
    spare = add_worker(cluster, SPARE)
    cluster.wait_for_nodes()
    reference = engine_tokens(tiny_dirs, PROMPTS, STREAM_TOKENS)
    lost_pids = {a.pid for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True,
                                            limit=10_000)
                 if a.class_name.split(":")[0] == "ServeReplica" and a.node_id == nodes["node_b"]}
    assert len(lost_pids) == 1, lost_pids

    mid_stream, stop = threading.Event(), threading.Event()

    def watch(attempt: Attempt) -> None:
        if attempt.replica in lost_pids:
            mid_stream.set()

    def client(first: int) -> list[list[Attempt]]:
        """Requests over the prompts, each retried until it succeeds (within the bound)."""
        requests_made = []
        for i in itertools.count(first):
            if stop.is_set():
                return requests_made
            prompt, attempts = PROMPTS[i % len(PROMPTS)], []
            requests_made.append(attempts)
            while not attempts or not ok(attempts[-1]):
                if attempts and time.monotonic() - attempts[0].started > BOUND_S:
                    return requests_made
                attempts.append(stream(served, prompt, watch))
                time.sleep(0.2 * (not ok(attempts[-1])))
        return requests_made

    with ThreadPoolExecutor(8) as pool:
        clients = [pool.submit(client, i) for i in range(8)]
        assert mid_stream.wait(BOUND_S), "no stream reached node_b's replica"
        killed_at = time.monotonic()
        cluster.remove_node(workers["node_b"], allow_graceful=False)
        time.sleep(6)  # the load goes on: requests sent after the loss, and the retries
        stop.set()
        made = [attempts for c in clients for attempts in c.result(timeout=2 * BOUND_S)]
    cut = [a for attempts in made for a in attempts if not ok(a)]

    kinds = "DrafterActor,ServeReplica,TargetActor"
    whole = {nodes["node_a"]: kinds, spare.node_id: kinds}  # a replica and its actors on each
    while True:  # Serve's controller replaces the lost replica
        placed = replica_nodes()
        states = serve.status().applications["specdec-multinode"].deployments["specdec"]
        running = states.replica_states == {"RUNNING": 2}
        if running and placed == whole or time.monotonic() - killed_at > BOUND_S:
            break
        time.sleep(0.5)
    back_s = time.monotonic() - killed_at

    with ThreadPoolExecutor(8) as pool:
        after = list(pool.map(lambda p: stream(served, p), PROMPTS * 2))

    for attempts in made:
        assert ok(attempts[-1]), attempts  # each request succeeded, at last on a retry
        assert attempts[-1].tokens == reference[attempts[0].prompt]
        for attempt in attempts:
            assert attempt.ended - attempt.started < BOUND_S, attempt  # none hangs
            if attempt.replica is not None and attempt.replica not in lost_pids:
                assert ok(attempt), attempt  # node_a's replica: unaffected
    assert cut, "the kill cut no request"
    assert {a.error for a in cut} <= CUT, [a.error for a in cut]
    assert all(a.replica in lost_pids | {None} for a in cut), cut
    assert placed == whole, (placed, back_s)
    assert running, states.replica_states
    assert [a.error for a in after] == [None] * len(after)
    assert all(a.tokens == reference[a.prompt] and a.done for a in after)
    ends = [a.ended - killed_at for a in cut if a.started < killed_at]
    sent_after = [attempts[0] for attempts in made if attempts[0].started > killed_at]
    print(f"\nNODE-LOSS requests={len(made)} cut={len(cut)} "
          f"errors={sorted({a.error for a in cut})} in_flight_cut={len(ends)} "
          f"in_flight_ended_s={min(ends, default=0):.2f}..{max(ends, default=0):.2f} "
          f"last_cut_s={max(a.ended for a in cut) - killed_at:.2f} replica_back_s={back_s:.1f} "
          f"sent_after_loss={len(sent_after)} (ok at once: {sum(map(ok, sent_after))}) "
          f"after={len(after)} ok")
