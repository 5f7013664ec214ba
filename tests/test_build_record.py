"""Builds record their own durations (issue 51, item 2): darel/tools/build_record.py runs a
command and writes its record; bench/durations_table.py puts the records on
docs/durations.md. The commands here are tiny stand-ins (`python -c ...`, a two-rule
Snakefile), never `make quick`; no assertion is about how long anything took."""

from __future__ import annotations

import base64
import calendar
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from darel.tools import build_record
from tests.conftest import ROOT

SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def _record(cwd: Path, target: str, command: list[str], *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, build_record.DIR_VARIABLE: str(cwd / "records"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "darel.tools.build_record", "--target", target, *extra, "--",
                           *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _git_repo(folder: Path) -> str:
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one", "--allow-empty"]):
        subprocess.run(cmd, cwd=folder, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=folder, check=True, capture_output=True,
                          text=True).stdout.strip()


def _durations_module():
    spec = importlib.util.spec_from_file_location("durations_table", ROOT / "bench/durations_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_build_writes_one_record_with_every_field(tmp_path):
    commit = _git_repo(tmp_path)
    stamp = tmp_path / "installed"
    stamp.touch()
    installed_at = time.time() - 60
    os.utime(stamp, (installed_at, installed_at))  # the install ended 3 s after make began
    done = _record(tmp_path, "quick", [sys.executable, "-c", "print('built')"], "--install-stamp", str(stamp),
                   "--make-started", f"{installed_at - 3:.3f}", "--load-before", "0.25")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "built\n"  # the command's own output passes through
    files = list((tmp_path / "records").iterdir())
    assert len(files) == 1 and re.fullmatch(r"\d{8}T\d{6}Z_quick_[0-9a-f]{8}\.json", files[0].name), files
    record = json.loads(files[0].read_text())
    assert set(build_record.REQUIRED) <= set(record)
    assert record["command"] == "make quick" and record["argv"][1:] == ["-c", "print('built')"]
    assert record["install_s"] == 3.0 and record["wall_s"] == round(record["build_s"] + 3.0, 1)
    assert record["started_utc"] == build_record.utc(installed_at - 3)  # from make's start, install included
    assert record["started_utc"] <= record["build_started_utc"] <= record["ended_utc"]
    assert record["commit"] == commit and record["changed"] is False
    machine = record["machine"]
    assert machine["cores"] == os.cpu_count() and machine["cpu"] and isinstance(machine["gpus"], list)
    assert re.fullmatch(r"[0-9a-f]{8}", machine["host_id"]) and files[0].name.endswith(f"_{machine['host_id']}.json")
    assert record["load"]["load1_before"] == 0.25 and record["load"]["verdict"] in ("idle", "busy")
    assert record["load"]["rule"] == build_record.BUSY_RULE
    assert record["jobs"] == []  # no Snakemake job ran
    assert "recorded in" in done.stderr and files[0].name in done.stderr
    assert not [p for p in (tmp_path / "records").iterdir() if p.name.startswith(".")]  # no temporary left


def test_a_failed_build_keeps_its_exit_status_and_records_nothing(tmp_path):
    done = _record(tmp_path, "quick", [sys.executable, "-c", "import sys; sys.exit(3)"])
    assert done.returncode == 3
    assert "failed (3); no duration recorded" in done.stderr
    assert not (tmp_path / "records").exists()


def test_an_install_done_before_this_make_is_not_counted_nor_counted_twice(tmp_path):
    stamp = tmp_path / "installed"
    stamp.touch()
    folder = tmp_path / "records"
    started = stamp.stat().st_mtime
    assert build_record.install_seconds(stamp, started + 10, folder) is None  # installed before make began
    assert build_record.install_seconds(stamp, started - 2, folder) == 2.0
    folder.mkdir()  # `make quick tables`: the first target's record has counted it
    (folder / "first.json").write_text(json.dumps({"make_started": started - 2, "install_s": 2.0}))
    assert build_record.install_seconds(stamp, started - 2, folder) is None


def test_the_command_line_refuses_a_bad_target_and_a_missing_command(tmp_path):
    done = _record(tmp_path, "../quick", ["true"])
    assert done.returncode == 2 and "--target '../quick'" in done.stderr
    done = subprocess.run([sys.executable, "-m", "darel.tools.build_record", "--target", "quick"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.returncode == 2 and "no command to run" in done.stderr


def _metadata(folder: Path, output: str, rule: str, start: float, end: float, job_hash: int) -> None:
    name = base64.urlsafe_b64encode(output.encode()).decode()
    (folder / name).write_text(json.dumps({"rule": rule, "starttime": start, "endtime": end, "job_hash": job_hash,
                                           "shellcmd": f"run {rule}", "incomplete": False}))


def test_snakemakes_metadata_gives_one_job_per_job_inside_the_window(tmp_path):
    folder = tmp_path / ".snakemake" / "metadata"
    folder.mkdir(parents=True)
    t = time.time() - 100
    _metadata(folder, "data/old.npz", "download", t - 50, t - 40, 1)  # an earlier build's job
    _metadata(folder, "runs/a/model.pt", "train", t + 10, t + 30.5, 2)  # one job, two outputs
    _metadata(folder, "runs/a/summary.json", "train", t + 10.001, t + 30, 2)
    _metadata(folder, "results/table1.csv", "table1", t + 31, t + 32, 3)
    jobs = build_record.snakemake_jobs(tmp_path, t, t + 40)
    assert jobs == [
        {"rule": "train", "output": "runs/a/model.pt", "start_s": 10.0, "seconds": 20.5},
        {"rule": "table1", "output": "results/table1.csv", "start_s": 31.0, "seconds": 1.0},
    ]
    assert build_record.snakemake_jobs(tmp_path / "elsewhere", t, t + 40) == []


@pytest.mark.slow
def test_a_real_snakemake_build_is_recorded_with_its_jobs(tmp_path):
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: "out/b.txt"\n'
        'rule a:\n    output: "out/a.txt", "out/a2.txt"\n    shell: "touch {output}"\n'
        'rule b:\n    input: "out/a.txt"\n    output: "out/b.txt"\n    shell: "cp {input} {output}"\n')
    done = _record(tmp_path, "quick", [str(SNAKEMAKE), "--cores", "1", "--quiet"])
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (tmp_path / "records").iterdir()
    record = json.loads(path.read_text())
    assert [(j["rule"], j["output"]) for j in record["jobs"]] == [("a", "out/a.txt"), ("b", "out/b.txt")]
    assert all(0 <= j["start_s"] <= record["build_s"] and j["seconds"] >= 0 for j in record["jobs"])
    assert record["commit"] is None and record["install_s"] is None  # no git repository, no install stamp


def test_the_load_verdict_follows_its_stated_rule():
    assert build_record.load_verdict(0.4, 0.1, cores=2) == "idle"
    assert build_record.load_verdict(1.2, 0.0, cores=2) == "busy"  # 0.6 per core before make began
    assert build_record.load_verdict(0.0, 0.3, cores=2) == "busy"  # others took 30 % during the build
    assert build_record.load_verdict(None, None, cores=2) == "idle"
    before, after = (100.0, 400.0), (180.0, 600.0)  # 80 busy seconds of 200
    assert build_record.others_share(before, after, own_cpu_s=50.0) == 0.15
    assert build_record.others_share(before, after, own_cpu_s=90.0) == 0.0
    assert build_record.others_share(None, after, own_cpu_s=1.0) is None


def test_the_machine_is_read_from_procs_texts():
    assert build_record.cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n") == "AMD EPYC 7B13"
    assert build_record.cpu_model("Hardware\t: BCM2835\n") == "BCM2835"
    assert build_record.cpu_model("") is None
    assert build_record.memory_bytes("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 24576000 * 1024
    assert build_record.memory_bytes("") is None
    busy, total = build_record.cpu_seconds("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    tick = os.sysconf("SC_CLK_TCK")
    assert (busy, total) == (150 / tick, 1000 / tick)


def _fake_record(jobs: list[dict]) -> dict:
    started = float(calendar.timegm((2026, 11, 29, 7, 0, 0)))
    return build_record.build_record(
        target="quick", argv=["snakemake", "--cores", "2"], make_started=started - 120, started=started,
        ended=started + 600, install_s=120.0, commit={"commit": "abc1234", "changed": False},
        machine={"cpu": "AMD EPYC 7B13", "cores": 2, "usable_cores": 2, "memory_gib": 8.0, "gpus": [],
                 "os": "Linux", "host_id": "0badcafe"},
        load_before=0.1, load_after=1.9, others=0.05, jobs=jobs)


def test_the_page_shows_a_record_and_its_time_per_stage(tmp_path):
    durations = _durations_module()
    jobs = [{"rule": "train", "output": "runs/1", "start_s": 0.0, "seconds": 100.0},
            {"rule": "train", "output": "runs/2", "start_s": 0.0, "seconds": 50.0},
            {"rule": "table1", "output": "results/table1.csv", "start_s": 150.0, "seconds": 2.0}]
    record = _fake_record(jobs)
    assert record["started_utc"] == "2026-11-29T06:58:00Z" and record["wall_s"] == 720.0
    path = build_record.record_path(tmp_path, record)
    path.write_text(json.dumps(record))
    page = durations.render(durations.load_record(), durations.load_builds(tmp_path))
    builds = page[page.index("## Recorded builds"):page.index("## Per stage")]
    assert (f"| idle | 12.0 | 2.0 | 2026-11-29 06:58:00 | abc1234 | AMD EPYC 7B13, 2 cores, 8.0 GiB, no GPU "
            f"(host 0badcafe) | 3 | [{path.name}](../bench/results/durations/{path.name}) |") in builds
    assert "### make quick" in builds
    stages = page[page.index("## Per stage: the latest `make quick`"):page.index("## Before the records")]
    assert "| train | 2 | 150.0 | 75.0 |" in stages and "| table1 | 1 | 2.0 | 2.0 |" in stages
    assert stages.index("| train |") < stages.index("| table1 |") and "| (every rule) | 3 | 152.0 | |" in stages
    assert "frozen" in page[page.index("## Before the records"):]  # the legacy record, labelled as such


def test_a_record_without_a_field_stops_the_page_naming_the_file(tmp_path):
    record = _fake_record([])
    del record["machine"]
    (tmp_path / "x_quick_0badcafe.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"x_quick_0badcafe\.json: a build record lacks machine"):
        build_record.read_records(tmp_path)
    (tmp_path / "x_quick_0badcafe.json").write_text("[1, 2")
    with pytest.raises(ValueError, match=r"x_quick_0badcafe\.json: not a build record"):
        build_record.read_records(tmp_path)


def test_the_makefiles_timed_targets_run_through_the_recorder(tmp_path):
    """quick, tables, studies and test start with $(RECORDED); `make quick` itself, with pip,
    snakemake and the summary stood in for by scripts, leaves one record in the default
    folder, the install (stale stamp, so make runs it) counted apart."""
    makefile = (ROOT / "Makefile").read_text()
    for target in ("quick", "tables", "studies", "test"):
        recipe = re.search(rf"^{target}:.*\n\t(.*)\n", makefile, re.M).group(1)
        assert recipe.startswith("$(RECORDED) "), (target, recipe)
    venv, work = tmp_path / "venv", tmp_path / "work"
    (venv / "bin").mkdir(parents=True)
    work.mkdir()
    (venv / "bin" / "activate").touch()
    for name in ("requirements.lock", "pyproject.toml"):
        (work / name).touch()  # newer than no stamp: make runs the install
    (venv / "bin" / "python").write_text(
        "#!/bin/sh\n"
        'case "$2" in darel.tools.summary) echo summary; exit 0;; pip) exit 0;; esac\n'
        f'exec {sys.executable} "$@"\n')
    (venv / "bin" / "snakemake").write_text('#!/bin/sh\necho "snakemake $*"\n')
    for name in ("python", "snakemake"):
        (venv / "bin" / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != build_record.DIR_VARIABLE}
    done = subprocess.run(["make", "-f", str(ROOT / "Makefile"), "quick", f"VENV={venv}", "CORES=1"], cwd=work,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "snakemake --cores 1 results/table1.csv" in done.stdout and "summary" in done.stdout
    (path,) = (work / "bench/results/durations").glob("*_quick_*.json")
    record = json.loads(path.read_text())
    assert record["argv"] == [str(venv / "bin" / "snakemake"), "--cores", "1", "results/table1.csv"]
    assert record["make_started"] is not None and record["load"]["load1_before"] is not None
    assert record["install_s"] is not None and record["install_s"] >= 0  # this make ran the install
    assert (venv / ".installed").stat().st_mtime >= record["make_started"]


def test_the_committed_page_counts_only_committed_records(tmp_path):
    """A record a local build has just written waits, off the committed page, until it is
    committed: `make quick` then `make test` in a fresh clone finds the page up to date."""
    durations = _durations_module()
    folder = tmp_path / "bench/results/durations"
    folder.mkdir(parents=True)
    first = _fake_record([])
    build_record.record_path(folder, first).write_text(json.dumps(first))
    _git_repo(tmp_path)
    later = {**_fake_record([]), "started_utc": "2026-11-30T08:00:00Z"}
    build_record.record_path(folder, later).write_text(json.dumps(later))
    assert [b["started_utc"] for b in durations.load_builds(folder)] == [first["started_utc"], "2026-11-30T08:00:00Z"]
    assert [b["started_utc"] for b in durations.load_builds(folder, tracked_only=True)] == [first["started_utc"]]


def test_gpus_are_named_through_nvml_and_none_without_it(monkeypatch):
    import types

    calls = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA L4",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=(141 if h == 0 else 24) * 2**30))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert build_record.gpus() == ["NVIDIA H200, 141 GiB", "NVIDIA L4, 24 GiB"]
    assert calls == ["init", "shutdown"]

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    assert build_record.gpus() == []
    record = _fake_record([])
    durations = _durations_module()
    assert durations.machine_text(record["machine"]) == "AMD EPYC 7B13, 2 cores, 8.0 GiB, no GPU (host 0badcafe)"
    record["machine"].update(gpus=["NVIDIA H200, 141 GiB"], usable_cores=1)
    assert durations.machine_text(record["machine"]) == \
        "AMD EPYC 7B13, 1 of 2 cores, 8.0 GiB, NVIDIA H200, 141 GiB (host 0badcafe)"
