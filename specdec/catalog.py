"""A catalog: the named implementations of one extension point, and what each one needs.

There is one catalog per extension point, built in one place next to its implementations:
``specdec.algorithms.policies.POLICIES``, ``specdec.algorithms.verify.VERIFIERS``,
``specdec.algorithms.losses.LOSSES`` and ``specdec.models.drafters.DRAFTERS``. Every other list
of names (the serve schema's ``Literal`` types, the CLI's choices, the training configs, the
references the server loads without files) is read from them, so adding an implementation is
one module plus one catalog line.

Terms:
- entry: one implementation: its ``name``, how to build or load it (``load``: a callable, or
  ``"module:attr"``, imported only when first built, so importing a catalog imports no
  implementation and no import cycle), and what it needs (``needs``: words such as ``"scorer"``
  that the callers check before building).
- config: the frozen dataclass of an entry's knobs (``specdec/knobs.py``), declared next to its
  code (``Entry("asd", ..., config="specdec.algorithms.asd:AsdConfig")``, a class or its path): which knobs an entry has is read here, and the
  request settings, schemas and command-line options are derived from it.
- reference: what a user writes to pick an entry. Usually the entry's name; an entry with
  ``claims`` also takes the references that predicate accepts (a checkpoint directory, a hub
  id), tried in catalog order.

This module is not a plugin system: importing a module registers nothing; a catalog is the
literal tuple of its entries.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


def no_taps(args: Any) -> tuple[int, ...]:
    """A drafter that reads none of the target's hidden states."""
    return ()


@dataclass(frozen=True)
class Entry:
    """One implementation of an extension point."""

    name: str
    load: str | Callable[..., Any]  # the builder, or "module:attr" naming it
    summary: str = ""  # one line for help texts
    needs: frozenset[str] = frozenset()  # e.g. "scorer" (PACER), "target_weights" (a drafter)
    # a drafter: the target layers whose outputs it reads, given what it is loaded from
    # (``specdec.models.drafters.DrafterArgs``); reads config files only, never weights
    tap_layers: Callable[[Any], tuple[int, ...]] = no_taps
    # None: the reference is the name; else which other references this entry loads
    claims: Callable[[str], bool] | None = None
    # the dataclass of its knobs, or "module:attr" naming it; None: it has none
    config: type | str | None = None

    def builder(self) -> Callable[..., Any]:
        return _imported(self.load)

    def config_class(self) -> type | None:
        return None if self.config is None else _imported(self.config)


def _imported(obj: Any) -> Any:
    """``obj``, or the attribute a "module:attr" string names."""
    if not isinstance(obj, str):
        return obj
    module, _, attr = obj.partition(":")
    return getattr(importlib.import_module(module), attr)


class Catalog:
    """The entries of one extension point (``kind``: "verifier", "draft policy", ...), in order."""

    def __init__(self, kind: str, *entries: Entry, plural: str | None = None):
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate {kind} names in {names}")
        self.kind, self.plural = kind, plural or f"{kind}s"
        self.entries = entries
        self._by_name = {e.name: e for e in entries}

    def names(self, *, without: str | None = None) -> tuple[str, ...]:
        """Every entry's name, sorted; ``without``: only the entries that do not need it."""
        return tuple(sorted(e.name for e in self.entries if without not in e.needs))

    def named(self) -> tuple[str, ...]:
        """The names that are themselves references (no files behind them), sorted."""
        return tuple(sorted(e.name for e in self.entries if e.claims is None))

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, name: str) -> Entry:
        """The entry called ``name``; an unknown name raises, listing the known ones."""
        if name not in self._by_name:
            raise ValueError(f"unknown {self.kind} {name!r}; known {self.plural}: "
                             f"{', '.join(self.names())}")
        return self._by_name[name]

    def resolve(self, ref: str) -> Entry:
        """The entry that loads reference ``ref``: the entry of that name, else the first whose
        ``claims`` accepts it."""
        entry = self._by_name.get(ref)
        if entry is not None and entry.claims is None:
            return entry
        for entry in self.entries:
            if entry.claims is not None and entry.claims(ref):
                return entry
        raise ValueError(f"unknown {self.kind} {ref!r}; known {self.plural}: "
                         f"{', '.join(self.named())}, or a reference to "
                         f"{', '.join(e.name for e in self.entries if e.claims is not None)}")

    def build(self, name: str, *args: Any, **params: Any) -> Any:
        """Build entry ``name`` with ``params``; a keyword it does not take raises ValueError."""
        builder = self.get(name).builder()
        signature = inspect.signature(builder)
        try:
            signature.bind(*args, **params)
        except TypeError as err:  # an unknown or missing keyword
            raise ValueError(f"bad parameters for {self.kind} {name!r}: {err}; allowed: "
                             f"{sorted(signature.parameters)}") from None
        return builder(*args, **params)

    def build_from(self, name: str, config: Any = None, *args: Any, **params: Any) -> Any:
        """Build entry ``name`` from its config (``Class(**fields(config))``; None: the
        builder's defaults), ``params`` adding to or overriding the config's fields."""
        knobs = {} if config is None else {f.name: getattr(config, f.name)
                                           for f in dataclasses.fields(config)}
        return self.build(name, *args, **(knobs | params))
