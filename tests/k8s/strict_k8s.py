"""A strict reader of Kubernetes objects: builds ``kubernetes.client`` models from plain dicts
and rejects any key the model does not define.

The client's own deserializer silently drops unknown keys, so a misspelt ``volumeMount`` or a
field at the wrong level would pass unnoticed. This walks ``openapi_types`` / ``attribute_map``
of each model class instead. It checks structure and required fields (the models' constructors
do that), not admission rules that only an API server knows.
"""

from __future__ import annotations

import re

from kubernetes import client
from kubernetes.utils import parse_quantity

PRIMITIVES = {"str": str, "int": int, "float": (int, float), "bool": bool, "object": object,
              "datetime": str, "date": str}


class SchemaError(ValueError):
    pass


def build(data, type_name: str, path: str = ""):
    """``data`` as an instance of the client type ``type_name`` (``V1PodTemplateSpec``,
    ``list[V1Container]``, ``dict[str, str]``, ...); raises ``SchemaError`` naming the path."""
    if data is None:
        return None
    if m := re.fullmatch(r"list\[(.+)\]", type_name):
        _expect(data, list, path)
        return [build(v, m.group(1), f"{path}[{i}]") for i, v in enumerate(data)]
    if m := re.fullmatch(r"dict[(\[](\w+), (.+)[)\]]", type_name):
        _expect(data, dict, path)
        return {k: build(v, m.group(2), f"{path}.{k}") for k, v in data.items()}
    if type_name in PRIMITIVES:
        _expect(data, PRIMITIVES[type_name], path)
        return data
    return _model(data, getattr(client, type_name), path)


def _model(data, cls, path: str):
    _expect(data, dict, path)
    by_key = {key: attr for attr, key in cls.attribute_map.items()}
    unknown = sorted(set(data) - set(by_key))
    if unknown:
        raise SchemaError(f"{path or cls.__name__}: unknown keys {unknown} for {cls.__name__}")
    kwargs = {by_key[k]: build(v, cls.openapi_types[by_key[k]], f"{path}.{k}")
              for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as e:  # a required field is missing, or an enum value is wrong
        raise SchemaError(f"{path or cls.__name__}: {e}") from None


def _expect(value, kind, path: str) -> None:
    if kind is object:
        return
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise SchemaError(f"{path}: expected {kind}, got {type(value).__name__} {value!r}")


def quantities(resources: dict | None) -> dict:
    """A container's ``resources.limits`` (or requests) as numbers: cpu in cores, memory in
    bytes, ``nvidia.com/gpu`` in devices."""
    return {k: float(parse_quantity(v)) for k, v in (resources or {}).items()}
