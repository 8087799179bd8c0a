"""The schemas and options derived from the algorithms' configs have exactly their knobs, with
the same defaults, so the serve YAML, the HTTP body, the CLI, the jobs and the benchmark cannot
drift from the configs (``specdec.engine.settings``: ``FLAT``, ``SECTIONS``)."""

from __future__ import annotations

import argparse

import pytest

from bench.config import AsdSettings
from cluster import protocol
from cluster.schema import ServeArgs, Speculative
from pipelines.common.settings import PacerSettings, VerifierSettings
from specdec import cli
from specdec.algorithms.asd import AsdConfig
from specdec.engine.settings import FLAT, SECTIONS, SpecSettings, flat_knob
from specdec.knobs import knobs

NAMES = {"policy", "verify"}


def defaults(model) -> dict:
    return {name: f.default for name, f in model.model_fields.items()}


def generate_options() -> dict[str, object]:
    parser = argparse.ArgumentParser()
    cli.add_speculative(parser)
    return {a.dest: a.default for a in parser._actions if a.dest != "help"}


def test_the_cli_has_an_option_per_flat_key_with_its_default():
    options = generate_options()
    assert set(options) == NAMES | set(FLAT)
    assert {k: options[k] for k in FLAT} == {k: flat_knob(k)[1].default for k in FLAT}


def test_the_serve_and_http_schema_have_every_flat_key_and_section():
    # acceptance: a request's switch of the server's acceptance model (the CLI's is --acceptance)
    assert set(Speculative.model_fields) == NAMES | {"acceptance"} | set(FLAT) | set(SECTIONS)
    assert {k: defaults(Speculative)[k] for k in FLAT} == {k: flat_knob(k)[1].default
                                                          for k in FLAT}
    for name, cls in SECTIONS.items():
        section = Speculative.model_fields[name].annotation.__args__[0]  # X | None
        assert defaults(section) == {f.name: f.default for f in knobs(cls)}
    assert ServeArgs.model_fields["speculative"].annotation is Speculative
    assert protocol.Request.model_fields["speculative"].annotation == Speculative | None


def test_the_served_defaults_are_the_engines():
    served = ServeArgs.model_validate({"target": "x"}).speculative
    assert SpecSettings(**served.model_dump(exclude_unset=True)) == SpecSettings()
    assert SpecSettings(**served.model_dump(exclude_none=True)) == SpecSettings()


def test_the_job_and_benchmark_settings_have_the_configs_knobs():
    pacer_keys = {k for k, targets in FLAT.items() if any(s == "pacer" for s, _ in targets)}
    assert defaults(PacerSettings) == {k: flat_knob(k)[1].default for k in pacer_keys}
    asd = {f.name: f.default for f in knobs(AsdConfig)}
    assert defaults(VerifierSettings) == {"name": "strict", **asd}
    assert set(AsdSettings.model_fields) == {"budgets"} | set(asd) - {"budget"}


@pytest.mark.parametrize("body,param", [
    ({"gamma": 0}, "speculative.gamma"),
    ({"asd": {"gate": -1.0}}, "speculative.asd.gate"),
    ({"pacer": {"bogus": 1}}, "speculative.pacer.bogus"),
])
def test_a_bad_http_value_is_a_400_naming_the_field(body, param):
    with pytest.raises(protocol.ApiError) as err:
        protocol.parse(protocol.CompletionRequest,
                       {"model": "m", "prompt": "x", "speculative": body})
    assert (err.value.status, err.value.param) == (400, param)
