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

The module replaces the session's one-node cluster (tests/conftest.py ``ray_cluster``) with its
own, so it runs last (``multinode`` marker, ordered in tests/conftest.py).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
import requests

from tests.cluster.conftest import free_port
from tests.pipelines.test_train_drafter import tiny_corpus  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.multinode]

WORKERS = ("node_a", "node_b")
PROMPTS = ["hello world hello world, hello", "def f(x):\n    return x + 1\n\ndef g(", "a b a b a",
           "the cat sat on the", "1, 2, 3, 4,", "x = [", "hello hello", "zzz"]


@pytest.fixture(scope="module")
def nodes():
    """{name: node id} of the two worker nodes; the driver is connected to the cluster."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 token auth (docs/DESIGN.md)
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # the session's cluster: every test that used it has run
        serve.shutdown()
        ray.shutdown()
    with pytest.MonkeyPatch.context() as env:
        # no idle workers started ahead on each raylet: on two cores they slow the start down
        env.setenv("RAY_enable_worker_prestart", "0")
        env.setenv("RAY_prestart_worker_first_driver", "0")
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                                "include_dashboard": True})
        ids = {name: cluster.add_node(num_cpus=3, resources={name: 1, "worker": 1,
                                                                      "trainer": 1}).node_id
               for name in WORKERS}
        cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield ids
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


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


def test_each_replica_and_its_actors_share_one_worker_node(served, nodes):
    """The replicas' placement groups: one per worker node, each holding its replica, target and
    drafter actors, all alive on that node."""
    from ray.util.state import list_actors

    groups: dict[str, list] = {}
    for actor in list_actors(filters=[("state", "=", "ALIVE")], detail=True, limit=10_000):
        if actor.placement_group_id:
            groups.setdefault(actor.placement_group_id, []).append(actor)
    assert len(groups) == 2
    on = set()
    for actors in groups.values():
        kinds = sorted(a.class_name.split(":")[0] for a in actors)
        assert kinds == ["DrafterActor", "ServeReplica", "TargetActor"]
        assert len({a.node_id for a in actors}) == 1, [(a.class_name, a.node_id) for a in actors]
        on.add(actors[0].node_id)
    assert on == set(nodes.values())


def test_both_replicas_answer_as_the_engine_does(served, nodes, tiny_dirs):
    """Greedy completions sent at once reach both nodes' targets, and each equals the engine's."""
    from specdec.engine.engine import Engine
    from specdec.engine.loading import load_pair
    from specdec.engine.settings import GenerationParams

    pair = load_pair(tiny_dirs["target"], tiny_dirs["drafter"], dtype="float64")
    engine, tokenizer = Engine(pair.target, pair.drafter), pair.target.tokenizer
    before = actor_tasks_per_node()

    def complete(prompt: str) -> list[int]:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 24}
        reply = requests.post(f"{served}/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]

    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(complete, PROMPTS * 2))
    for prompt, tokens in zip(PROMPTS * 2, outputs, strict=True):
        ids = tokenizer(prompt)["input_ids"]
        assert tokens == engine.generate(ids, GenerationParams(24)).token_ids, prompt
    deadline = time.monotonic() + 30  # task events reach the state API within a few seconds
    while True:
        after = actor_tasks_per_node()
        grew = {n for n in nodes.values() if after.get(n, 0) > before.get(n, 0)}
        if grew == set(nodes.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert grew == set(nodes.values()), (before, after)


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
