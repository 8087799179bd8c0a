"""The strict Kubernetes reader rejects what the client's deserializer would drop."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.k8s.strict_k8s import SchemaError, build, quantities

POD = {"spec": {"containers": [{"name": "c", "image": "i",
                                "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}]}}


def test_a_valid_pod_template_builds():
    pod = build(POD, "V1PodTemplateSpec")
    assert isinstance(pod, client.V1PodTemplateSpec)
    assert pod.spec.containers[0].resources.limits == {"cpu": "500m", "memory": "1Gi"}


@pytest.mark.parametrize("bad,where", [
    ({"spec": {"containers": [{"name": "c", "image": "i", "volumeMount": []}]}}, "volumeMount"),
    ({"spec": {"containers": [{"image": "i"}]}}, "name"),
    ({"spec": {"containers": {"name": "c"}}}, "containers"),
    ({"spec": {"containers": [{"name": "c", "ports": [{"containerPort": "80"}]}]}}, "containerPort"),
    ({"spec": {"containers": [], "volumes": [{"name": "v", "emptyDir": {"medum": "Memory"}}]}},
     "medum"),
])
def test_mistakes_are_refused(bad, where):
    with pytest.raises(SchemaError, match=where):
        build(bad, "V1PodTemplateSpec")


def test_quantities():
    assert quantities({"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "2"}) == {
        "cpu": 0.5, "memory": 2.0**30, "nvidia.com/gpu": 2.0}
