"""A replica's placement group (cluster.placement): its bundles, the check against the nodes, and
the serve args it reads (custom resources, accelerator type, strategy). No Ray cluster: the
placed replicas are in tests/cluster/test_multinode.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster import placement
from cluster.app import actor_options, runtime_env
from cluster.schema import Resources, ServeArgs


def args(**kw) -> ServeArgs:
    return ServeArgs.model_validate({"target": "x", "drafter": "some/block-drafter", **kw})


def test_bundles_are_replica_target_and_drafter_in_order():
    bundles = placement.bundles(args(
        server_num_cpus=0.25,
        target_resources={"num_cpus": 2, "num_gpus": 1, "resources": {"node_a": 1},
                          "accelerator_type": "H100"},
        drafter_resources={"num_cpus": 0.5, "num_gpus": 0.5}))
    assert [b.field for b in bundles] == ["server_num_cpus", "target_resources", "drafter_resources"]
    assert bundles[placement.REPLICA_BUNDLE].resources == {"CPU": 0.25}
    assert bundles[placement.TARGET_BUNDLE].resources == {
        "CPU": 2.0, "GPU": 1.0, "node_a": 1.0, "accelerator_type:H100": 0.001}
    assert bundles[placement.DRAFTER_BUNDLE].resources == {"CPU": 0.5, "GPU": 0.5}


def test_a_drafter_without_an_actor_has_no_bundle():
    for drafter in ("none", "ngram", "suffix"):
        assert [b.field for b in placement.bundles(args(drafter=drafter))] == [
            "server_num_cpus", "target_resources"]
    assert len(placement.bundles(args(drafter="ngram", drafter_placement="actor"))) == 3


def test_an_empty_bundle_is_refused_naming_its_field():
    with pytest.raises(ValueError, match=r"bundle 0 \(server_num_cpus\) reserves no resource"):
        placement.bundles(args(server_num_cpus=0))
    with pytest.raises(ValueError, match=r"bundle 1 \(target_resources\) reserves no resource"):
        placement.bundles(args(target_resources={"num_cpus": 0}))


def test_check_names_the_bundle_and_the_missing_resource():
    bundles = placement.bundles(args(target_resources={"num_cpus": 1, "num_gpus": 1}))
    cpu_nodes = [{"CPU": 8.0}, {"CPU": 4.0}]
    with pytest.raises(ValueError, match=r"bundle 1 \(target_resources .*1 GPU \(the most a node "
                                         r"has: 0\)"):
        placement.check(bundles, "PACK", cpu_nodes)
    pinned = placement.bundles(args(target_resources={"resources": {"node_c": 1}}))
    with pytest.raises(ValueError, match="1 node_c"):
        placement.check(pinned, "SPREAD", [{"CPU": 8.0, "node_a": 1.0}])
    with pytest.raises(ValueError, match="fits on no node"):
        placement.check(bundles, "PACK", [])


def test_strict_pack_needs_one_node_for_the_whole_group():
    bundles = placement.bundles(args(server_num_cpus=1, target_resources={"num_cpus": 2},
                                     drafter_resources={"num_cpus": 1}))
    two_small = [{"CPU": 2.0}, {"CPU": 2.0}]
    placement.check(bundles, "PACK", two_small)  # each bundle fits some node
    placement.check(bundles, "SPREAD", two_small)
    with pytest.raises(ValueError, match=r"STRICT_PACK .*4 CPU \(the most a node has: 2\)"):
        placement.check(bundles, "STRICT_PACK", two_small)
    placement.check(bundles, "STRICT_PACK", [*two_small, {"CPU": 4.0}])


def test_strategy_and_resources_are_checked_naming_the_field():
    assert args().placement_strategy == "STRICT_PACK" and args().check_placement
    assert args(placement_strategy="SPREAD").placement_strategy == "SPREAD"
    with pytest.raises(ValidationError, match="placement_strategy"):
        args(placement_strategy="STRICT_SPREAD")
    with pytest.raises(ValidationError, match=r"custom resources only, not \['GPU'\]"):
        Resources(resources={"GPU": 1})
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        Resources(resources={"node_a": -1})


def test_actor_options_carry_custom_resources_and_accelerator_type():
    resources = Resources(num_cpus=1, num_gpus=1, resources={"node_a": 1}, accelerator_type="L4")
    options = actor_options(resources, args())
    assert options["resources"] == {"node_a": 1} and options["accelerator_type"] == "L4"
    assert "scheduling_strategy" not in options  # no bundle asked for
    assert "accelerator_type" not in actor_options(Resources(), args())


def test_every_process_of_the_app_starts_with_the_wait_policy_and_the_mlflow_store(monkeypatch):
    """OpenMP reads OMP_WAIT_POLICY when torch loads, so the actors and the replica get it in
    their runtime_env; one the environment sets is kept; one it contradicts is an error."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert runtime_env(args()) == {}  # libgomp's default: nothing to set
    assert runtime_env(args(omp_wait_policy="passive")) == {
        "env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}
    env = actor_options(Resources(), args(omp_wait_policy="active", mlflow_tracking_uri="x"))
    assert env["runtime_env"] == {"env_vars": {"OMP_WAIT_POLICY": "ACTIVE",
                                               "MLFLOW_TRACKING_URI": "x"}}
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert runtime_env(args()) == {"env_vars": {"OMP_WAIT_POLICY": "active"}}
    with pytest.raises(ValueError, match="omp_wait_policy: passive, but the environment"):
        runtime_env(args(omp_wait_policy="passive"))
    with pytest.raises(ValidationError, match="omp_wait_policy"):
        args(omp_wait_policy="spin")
