"""The workflow files themselves: Snakemake's linter, and the .test smoke configuration."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from darel import config
from tests.conftest import ROOT, copy_worktree, run_in

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# The two remarks the Snakefile's header justifies; anything else is a finding.
JUSTIFIED = {"Specify a conda environment or container for each rule.",
             "Shell command directly uses variable PY from outside of the rule"}


def test_snakemake_lint_has_only_the_justified_remarks(tmp_path):
    copy_worktree(tmp_path)
    out = run_in(tmp_path, SNAKEMAKE, "--lint", check=False)
    text = out.stdout + out.stderr
    remarks = re.findall(r"^    \* (.+?):?$", text, flags=re.MULTILINE)
    assert remarks, text[-2000:]  # the linter ran and reported (at least the justified remarks)
    titles = {re.sub(r" in line \d+$", "", remark).rstrip(":") for remark in remarks}
    assert titles <= {title.rstrip(":") for title in JUSTIFIED}, sorted(titles)


def test_the_smoke_configuration_is_valid_plans_every_table_and_keeps_to_its_profile(tmp_path):
    params = yaml.safe_load((ROOT / ".test/params.yaml").read_text())
    cfg = config.validate(params)
    assert cfg["profile"] == "smoke" and "quick" not in cfg["profiles"]
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert set(params) == set(committed)  # the same keys as the committed file: no drift in its shape
    copy_worktree(tmp_path)
    out = run_in(tmp_path, SNAKEMAKE, "-n", "--config", "params_file=.test/params.yaml")
    jobs = re.findall(r"^(?:local)?rule (\w+):", out.stdout, flags=re.MULTILINE)
    assert {"table1", "nlg_table"} <= set(jobs)
    outputs = re.findall(r"^    output: (.+)$", out.stdout, flags=re.MULTILINE)
    paths = [p for line in outputs for p in line.split(", ") if p.startswith(("runs/", "data/", "results/cells"))]
    assert paths and all("/smoke" in p or "nlg_smoke" in p for p in paths), [p for p in paths if "smoke" not in p]


def test_a_params_file_outside_the_project_is_refused(tmp_path):
    copy_worktree(tmp_path)
    out = run_in(tmp_path, SNAKEMAKE, "-n", "--config", "params_file=../params.yaml", check=False)
    assert out.returncode != 0 and "params_file = '../params.yaml'" in out.stdout + out.stderr
