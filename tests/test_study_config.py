"""A study's controls and methods changed with --config alone (issue 50, item 5): the
overrides go through Snakemake's own parsing of --config and the project's merge
(config.workflow_config), as the workflow reads them."""

from __future__ import annotations

import pytest
from snakemake.cli import parse_config

from darel import config
from tests.conftest import ROOT


def _workflow_config(*entries: str) -> dict:
    """params.yaml with ``--config`` entries, parsed by Snakemake and merged as the Snakefile does."""
    return config.workflow_config(ROOT / "params.yaml", parse_config(list(entries)))


def test_a_null_override_drops_the_negative_control_and_leaves_the_positive_one():
    committed = _workflow_config()["study"]["table1"]["validation"]
    assert committed["negative"] == "darel-restream" and committed["positive"] == ["oracle-clean", "random"]
    for entry in ('study={"table1": {"validation": {"negative": null}}}',  # JSON, as the issue writes it
                  "study={table1: {validation: {negative: null}}}"):  # YAML flow style
        cfg = _workflow_config(entry)
        validation = cfg["study"]["table1"]["validation"]
        assert validation == {k: v for k, v in committed.items() if k != "negative"}
        assert config.study_verdict_params(cfg)["validation"] == {"positive": ["oracle-clean", "random"],
                                                                  "positive_cells": ["t0.80_m0.80"]}


def test_a_null_override_drops_the_positive_control_with_its_budgets():
    cfg = _workflow_config("study={table1: {validation: {positive: null, positive_budgets: null}}}")
    assert cfg["study"]["table1"]["validation"] == {"negative": "darel-restream"}
    assert config.study_verdict_params(cfg)["validation"] == {"negative": "darel-restream"}
    with pytest.raises(config.ConfigError, match=r"positive_budgets: no positive control is declared to judge at "
                                                 r"them \(to drop the positive control with --config, drop them too"):
        _workflow_config("study={table1: {validation: {positive: null}}}")


def test_both_controls_dropped_and_their_methods_with_them():
    cfg = _workflow_config("study={table1: {validation: null, methods: [darel, random]}}")
    assert "validation" not in cfg["study"]["table1"] and cfg["study"]["table1"]["methods"] == ["darel", "random"]
    assert config.study_methods(cfg) == ["darel", "random"]
    assert "validation" not in config.study_verdict_params(cfg)


@pytest.mark.parametrize("methods, control, method, drop", [
    ("[darel, random, oracle-clean]", "negative", "darel-restream", "negative: null"),
    ("[darel, random, darel-restream]", "positive", "oracle-clean", "positive: null, positive_budgets: null"),
])
def test_dropping_a_method_a_control_names_is_one_line_naming_both(methods, control, method, drop):
    with pytest.raises(config.ConfigError) as err:
        _workflow_config(f"study={{table1: {{methods: {methods}}}}}")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"params: study.table1.validation.{control} names '{method}', which is not among "
                              f"study.table1.methods: train it or drop the control (--config 'study={{table1: "
                              f"{{validation: {{{drop}}}}}}}')")
    # The override the message proposes is accepted.
    cfg = _workflow_config(f"study={{table1: {{methods: {methods}, validation: {{{drop}}}}}}}")
    assert method not in config.study_methods(cfg)


def test_null_only_removes_what_it_names_and_a_required_key_is_then_missing():
    assert config.coerce_cli_scalars({"a": "null", "b": ["NULL", "x"], "c": "nullable"}) == \
        {"a": None, "b": [None, "x"], "c": "nullable"}
    assert config.merge({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": None}, "e": None}) == {"a": {"c": 2}, "d": 3}
    with pytest.raises(config.ConfigError, match=r"params: study.table1: missing key 'methods'"):
        _workflow_config("study={table1: {methods: null}}")
    cfg = _workflow_config("study={table1: {primary: null}}")
    assert "primary" not in config.study_verdict_params(cfg)
