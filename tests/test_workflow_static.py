"""The workflow files themselves: Snakemake's linter, and the .test smoke configuration."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from darel import config
from tests.conftest import ROOT, copy_worktree, run_in

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# The remarks the Snakefile's header justifies; anything else is a finding.
JUSTIFIED = {"Specify a conda environment or container for each rule.",
             "Shell command directly uses variable PY from outside of the rule",
             "Shell command directly uses variable TRACKING_URI from outside of the rule",
             "Shell command directly uses variable LIVE_RUN from outside of the rule"}


def test_snakemake_lint_has_only_the_justified_remarks(tmp_path):
    copy_worktree(tmp_path)
    out = run_in(tmp_path, SNAKEMAKE, "--lint", check=False)
    text = out.stdout + out.stderr
    remarks = re.findall(r"^    \* (.+?):?$", text, flags=re.MULTILINE)
    assert remarks, text[-2000:]  # the linter ran and reported (at least the justified remarks)
    titles = {re.sub(r" in line \d+$", "", remark).rstrip(":") for remark in remarks}
    assert titles <= {title.rstrip(":") for title in JUSTIFIED}, sorted(titles)


# Written into a folder on PYTHONPATH: Python imports it at start-up; at exit it records
# whether the process (here: Snakemake reading the Snakefile, its rules and the preflight
# checks) ever imported torch.
_IMPORT_PROBE = """
import atexit, os, sys

def _record():
    with open(os.environ["DAREL_IMPORT_PROBE"], "a") as out:
        out.write(f"{os.path.basename(sys.argv[0])} {'torch' in sys.modules}\\n")

atexit.register(_record)
"""


def test_the_smoke_configuration_is_valid_plans_every_table_and_keeps_to_its_profile(tmp_path):
    """...and the workflow layer (Snakefile, rule files, preflight, the method declarations)
    plans it without importing torch: every Snakemake start, and every Slurm submission,
    pays only for what it reads."""
    params = yaml.safe_load((ROOT / ".test/params.yaml").read_text())
    cfg = config.validate(params)
    assert cfg["profile"] == "smoke" and "quick" not in cfg["profiles"]
    committed = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert set(params) == set(committed)  # the same keys as the committed file: no drift in its shape
    copy_worktree(tmp_path)
    probe = tmp_path / "_probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(_IMPORT_PROBE)
    out = run_in(tmp_path, SNAKEMAKE, "-n", "--config", "params_file=.test/params.yaml",
                 env={"PYTHONPATH": f"{probe}:{tmp_path}", "DAREL_IMPORT_PROBE": str(probe / "imports.txt")})
    assert (probe / "imports.txt").read_text().split() == ["snakemake", "False"]
    jobs = re.findall(r"^(?:local)?rule (\w+):", out.stdout, flags=re.MULTILINE)
    assert {"table1", "nlg_table"} <= set(jobs)
    outputs = re.findall(r"^    output: (.+)$", out.stdout, flags=re.MULTILINE)
    paths = [p for line in outputs for p in line.split(", ") if p.startswith(("runs/", "data/", "results/cells"))]
    assert paths and all("/smoke" in p or "nlg_smoke" in p for p in paths), [p for p in paths if "smoke" not in p]


def test_a_params_file_outside_the_project_is_refused(tmp_path):
    copy_worktree(tmp_path)
    out = run_in(tmp_path, SNAKEMAKE, "-n", "--config", "params_file=../params.yaml", check=False)
    assert out.returncode != 0 and "params_file = '../params.yaml'" in out.stdout + out.stderr


def test_a_paper_profile_dry_run_names_its_missing_inputs_and_its_gpu_before_the_jobs(tmp_path):
    """Here there is no CIFAR-100 archive and no CUDA GPU: the dry run says so, with the
    file, URL, MD5 and folder, before it lists a single job."""
    import os
    import subprocess

    import torch

    from darel import data

    copy_worktree(tmp_path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # One stream, as a terminal shows it: the lines must come before the job list.
    text = subprocess.run([SNAKEMAKE, "-n", "results/table1.csv", "--config", "profile=paper"], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600, check=True).stdout
    first_job = min(text.find(marker) for marker in ("rule download", "localrule download") if marker in text)
    missing = next(line for line in text.splitlines() if line.startswith("missing input:"))
    for part in ("data/raw/cifar-100-python.tar.gz", data.CIFAR100_URL, data.CIFAR100_MD5):
        assert part in missing, part
    assert 0 <= text.find(missing) < first_job
    if not torch.cuda.is_available():
        gpu = next(line for line in text.splitlines() if "needs a CUDA GPU" in line)
        assert text.find(gpu) < first_job
    assert not (tmp_path / "data" / "raw").exists()  # a dry run fetched and wrote nothing


@pytest.mark.parametrize("turns", [True, False])
def test_a_cuda_profile_gives_timed_jobs_its_threads_and_keeps_the_gpu_to_one_job(tmp_path, turns):
    """Under the gpu profile on 16 cores a timed job takes the profile's threads, not every
    core, so the jobs that never touch the GPU (records, tracking, the table) can run beside
    it. Without device turns every job that touches the GPU asks gpu=1, which the workflow
    profile limits to one; with them (the gpu profile's setting) the device is handed over
    by darel.devicelock and the scheduler only keeps two GPU jobs at once (gpu_queue=2: one
    on the device, one starting), so they ask gpu_queue=1 and neither gpu nor timed."""
    copy_worktree(tmp_path)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert params["profiles"]["gpu"]["device_turns"] is True
    extra = [] if turns else ["profiles={gpu: {device_turns: false}}"]
    out = run_in(tmp_path, SNAKEMAKE, "-n", "--cores", "16", "results/table1.csv", "--config", "profile=gpu", *extra)
    text = out.stdout + out.stderr
    threads = params["profiles"]["gpu"]["threads"]
    assert threads < 16
    jobs = re.split(r"\n(?=(?:local)?rule \w+:)", text)

    def of(*rules: str) -> list[str]:
        return [job for job in jobs if re.match(rf"(?:local)?rule ({'|'.join(rules)}):", job)]

    timed, on_gpu, off_gpu = (of("pretrain_scorer", "calibrate", "train_online"), of("score_losses", "ids_subset"),
                              of("cell_record", "track_cell", "table1"))
    assert timed and on_gpu and off_gpu
    for job in timed:
        assert re.search(rf"threads: {threads}\b", job), job
        assert bool(re.search(r"resources: .*\btimed=1\b", job)) is not turns, job
    for job in timed + on_gpu:
        assert bool(re.search(r"resources: .*\bgpu=1\b", job)) is not turns, job
        assert bool(re.search(r"resources: .*\bgpu_queue=1\b", job)) is turns, job
    for job in off_gpu:
        assert not re.search(r"\bgpu(_queue)?=[1-9]", job), job
    limits = yaml.safe_load((tmp_path / "profiles/default/config.yaml").read_text())["resources"]
    assert {"gpu=1", "timed=1", "gpu_queue=2"} <= set(limits)


# Stages that read and write records only: torch's import (about 5 s per job on the GPU
# machine, bench/results/gpu_2026-11-27b) is none of their work.
RECORD_STAGES = ("cell_record", "track", "table1", "study_table", "subset", "study_subset", "download", "nlg_table")


def test_record_only_stages_start_without_torch():
    import subprocess

    probe = ("import runpy, sys\nsys.argv = [sys.argv[1], '--help']\ntry:\n    runpy.run_path(sys.argv[0], "
             "run_name='__main__')\nexcept SystemExit:\n    pass\nprint('TORCH', 'torch' in sys.modules)\n")
    for stage in RECORD_STAGES:
        done = subprocess.run([sys.executable, "-c", probe, str(ROOT / "stages" / f"{stage}.py")], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (stage, done.stderr[-2000:])
        assert done.stdout.strip().splitlines()[-1] == "TORCH False", stage
