"""Knobs: the fields of an algorithm's config, each declared once with its default, bounds and help.

What this module is: ``knob(...)``, a dataclass field that carries its constraint (``ge``,
``gt``, ``le``) and a one-line help text in its metadata; ``Knobs``, the base of a frozen config
dataclass, which checks those constraints on construction; and the two views derived from a
config class, so that no schema or command line declares a knob again: ``pydantic_field``
(a pydantic field with the same default, bounds and description, for the serve / job / benchmark
schemas) and ``add_option`` (an argparse option with the same default, type and help).

What it is not: it knows no algorithm and no catalog. Each algorithm declares its config next to
its code (``FixedConfig`` in ``specdec/algorithms/policies.py``, ``AsdConfig`` in ``asd.py``,
``SuffixOptions`` in ``specdec/models/suffix.py``, ...); ``specdec/engine/settings.py`` puts them
together into a request's settings.

Terms:
- knob: one field of a config: a name, a type (``int``, ``float`` or ``bool``), one default.
- flat key: the name a knob has in the flat request body of before the configs
  (``asd_gate`` for ``AsdConfig.gate``); ``knob(flat=...)`` sets it, else it is
  ``<section>_<field>`` (see ``specdec.engine.settings.FLAT``).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

BOUNDS = {"ge": (lambda v, b: v >= b, ">="), "gt": (lambda v, b: v > b, ">"),
          "le": (lambda v, b: v <= b, "<=")}


def knob(default: Any, help: str, *, ge: float | None = None, gt: float | None = None,
         le: float | None = None, flat: str | None = None) -> Any:
    """A config field: its default, its bounds and its help, in one place."""
    bounds = {k: v for k, v in {"ge": ge, "gt": gt, "le": le}.items() if v is not None}
    return dataclasses.field(default=default, metadata={"help": help, "bounds": bounds,
                                                        "flat": flat})


class Knobs:
    """Base of a frozen config dataclass whose fields are ``knob``s: bad values raise on
    construction, naming the field. A subclass that checks more calls ``super().__post_init__()``."""

    def __post_init__(self):
        for f in knobs(type(self)):
            value = getattr(self, f.name)
            if kind(type(self), f) is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{label(self, f)} must be an integer, got {value!r}")
            for bound, limit in f.metadata["bounds"].items():
                ok, sign = BOUNDS[bound]
                if not ok(value, limit):
                    raise ValueError(f"{label(self, f)} must be {sign} {limit:g}, got {value}")


def label(config: Any, f: dataclasses.Field) -> str:
    return f"{type(config).__name__}.{f.name} ({f.metadata['help']})"


def knobs(cls: type) -> tuple[dataclasses.Field, ...]:
    """The knob fields of a config class (fields without knob metadata, such as PACER's
    ``scorer``, are not knobs)."""
    return tuple(f for f in dataclasses.fields(cls) if "bounds" in f.metadata)


def kind(cls: type, f: dataclasses.Field) -> type:
    """The knob's type (``int``, ``float``, ``bool``), resolved from the class's annotations."""
    return _hints(cls)[f.name]


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def pydantic_field(cls: type, f: dataclasses.Field, *, optional: bool = False):
    """``(type, FieldInfo)`` for ``pydantic.create_model``: the knob's type, default, bounds and
    help; ``optional``: ``type | None`` defaulting to None (unset: the config's default)."""
    from pydantic import Field

    if optional:
        return kind(cls, f) | None, Field(None, description=f.metadata["help"],
                                          **f.metadata["bounds"])
    return kind(cls, f), Field(f.default, description=f.metadata["help"], **f.metadata["bounds"])


def pydantic_model(cls: type):
    """A strict pydantic model of a config's knobs (unknown keys are errors), named after it."""
    from pydantic import ConfigDict, create_model

    return create_model(cls.__name__, __config__=ConfigDict(extra="forbid", frozen=True),
                        **{f.name: pydantic_field(cls, f) for f in knobs(cls)})


def add_option(parser, cls: type, f: dataclasses.Field, flag: str, dest: str) -> None:
    """An argparse option ``--flag`` for a knob: its type, default and help (a bool knob is a
    switch)."""
    help = f"{f.metadata['help']} (default: {f.default})"
    if kind(cls, f) is bool:
        parser.add_argument(f"--{flag}", dest=dest, action="store_true", default=f.default,
                            help=help)
    else:
        parser.add_argument(f"--{flag}", dest=dest, type=kind(cls, f), default=f.default,
                            help=help)
