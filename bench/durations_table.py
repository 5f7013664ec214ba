"""Write docs/durations.md from the recorded durations:
`python bench/durations_table.py > docs/durations.md`.

Two sources, neither typed into the page:

* bench/results/durations/*.json, the records builds write of themselves (`make quick`,
  `make tables`, `make studies` and `make test` run through darel/tools/build_record.py);
* bench/results/durations.yaml, the frozen legacy record: the measurements people typed in
  before builds recorded themselves. Nothing new goes into it.

The page is generated, never edited by hand; tests/test_readme.py checks that the committed
page equals this script's output, so a new record is committed and the page regenerated."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from a checkout: darel is the checkout's

from darel.tools.build_record import BUSY_RULE, read_records  # noqa: E402

RECORD = ROOT / "bench/results/durations.yaml"
BUILDS = ROOT / "bench/results/durations"
COMMAND = "python bench/durations_table.py > docs/durations.md"
FIELDS = ("command", "load", "minutes", "date", "commit", "machine", "note", "source")
LOADS = ("idle", "busy")


def load_record(path: Path = RECORD) -> dict:
    """The legacy record, checked: every entry has every field, a known load and machine."""
    record = yaml.safe_load(path.read_text(encoding="utf-8"))
    machines = record["machines"]
    for number, entry in enumerate(record["durations"], start=1):
        missing = [name for name in FIELDS if name not in entry]
        if missing:
            raise ValueError(f"{path.name}: entry {number} ({entry.get('command')!r}) lacks {', '.join(missing)}")
        if entry["load"] not in LOADS:
            raise ValueError(f"{path.name}: entry {number}: load {entry['load']!r} is not one of {LOADS}")
        if entry["machine"] not in machines:
            raise ValueError(f"{path.name}: entry {number}: machine {entry['machine']!r} is not under machines:")
    return record


def load_builds(folder: Path = BUILDS, tracked_only: bool = False) -> list[dict]:
    """The builds' own records, oldest first (darel.tools.build_record.read_records); with
    ``tracked_only``, only those git tracks: a record a local build has just written is not on
    the committed page until it is committed and the page regenerated, so `make quick` then
    `make test` in a fresh clone still finds the committed page up to date."""
    records = read_records(folder)
    if not tracked_only:
        return records
    if not folder.is_dir():
        return records
    listed = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=folder, capture_output=True, text=True)
    if listed.returncode != 0:  # not a git checkout: nothing to tell committed from new
        return records
    tracked = {Path(name).name for name in listed.stdout.split("\0") if name}
    return [r for r in records if r["file"] in tracked]


def _minutes(entry: dict) -> str:
    value = entry["minutes"]
    text = str(value)
    if entry.get("estimate"):
        return f"{text} (estimate)"
    return f"about {text}" if entry.get("approx") else text


def _cell(value) -> str:
    return "" if value is None else str(value).replace("|", "\\|")


def machine_text(machine: dict) -> str:
    """A build record's machine in one cell: CPU, cores, memory, GPUs and the host id."""
    gpus = "; ".join(machine.get("gpus") or []) or "no GPU"
    cores = machine.get("cores")
    usable = machine.get("usable_cores")
    cores_text = f"{cores} cores" if usable in (None, cores) else f"{usable} of {cores} cores"
    memory = machine.get("memory_gib")
    memory_text = f", {memory} GiB" if memory is not None else ""
    return f"{machine.get('cpu')}, {cores_text}{memory_text}, {gpus} (host {machine.get('host_id')})"


def build_row(build: dict) -> list[str]:
    """One build record's cells: load, minutes, install minutes, start, commit, machine, jobs, file."""
    install = "not part of it" if build["install_s"] is None else f"{build['install_s'] / 60:.1f}"
    commit = build["commit"] or ""
    if commit and build.get("changed"):
        commit += " (with changes)"
    jobs = "" if build["jobs"] is None else str(len(build["jobs"]))
    return [build["load"]["verdict"], f"{build['wall_s'] / 60:.1f}", install,
            build["started_utc"].replace("T", " ").replace("Z", ""), commit, machine_text(build["machine"]),
            jobs, f"[{build['file']}](../bench/results/durations/{build['file']})"]


def per_rule(jobs: list[dict]) -> list[tuple[str, int, float]]:
    """(rule, jobs, seconds summed) for each rule of a build, the longest total first."""
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for job in jobs:
        totals[job["rule"]][0] += 1
        totals[job["rule"]][1] += job["seconds"]
    return sorted(((rule, n, s) for rule, (n, s) in totals.items()), key=lambda row: (-row[2], row[0]))


def _header() -> list[str]:
    return [
        "# How long it takes",
        "",
        f"<!-- GENERATED by `{COMMAND}` from bench/results/durations/ and bench/results/durations.yaml: "
        "edit neither this page nor the legacy record; a new measurement is a new build record. -->",
        "",
        "Wall-clock minutes of the project's commands as measured, each with its machine, load,",
        "date and commit. Times inside the tables (`time_s`) are CPU seconds and do not move with",
        "the load (bench/README.md, \"The CPU clock of `time_s`\").",
        "",
        "## How a measurement is made",
        "",
        "`make quick`, `make tables`, `make studies` and `make test` record themselves: each runs",
        "its command through `python -m darel.tools.build_record` (darel/tools/build_record.py),",
        "which, when the command succeeds, writes",
        "`bench/results/durations/<UTC start>_<target>_<host id>.json`: the command, its start",
        "and end (UTC), the wall seconds of the build and, measured apart, of the environment's",
        "install when that make ran it, the commit, the machine (CPU model, cores, memory, GPUs),",
        "the load, and every Snakemake job of the build with its rule and seconds, taken from",
        "Snakemake's own metadata (.snakemake/metadata/: the job's start and its output's time,",
        "to the microsecond, with the rule's name; a stage's log under logs/ starts only after",
        "its interpreter's imports, Snakemake's text log gives whole seconds, and no rule has a",
        "`benchmark:` file). A failed build records nothing; `DAREL_DURATIONS_DIR` sends the",
        "records elsewhere. To add a measurement: run the make target, commit the file it",
        f"wrote, and regenerate this page with `{COMMAND}` (the page's test counts committed",
        "records only).",
        "",
        f"*Idle* or *busy*: {BUSY_RULE}.",
        "",
    ]


def _builds_section(builds: list[dict]) -> list[str]:
    lines = ["## Recorded builds", ""]
    if not builds:
        return lines + ["No build record is committed yet: the frozen legacy record below holds the measurements",
                        "so far.", ""]
    order: list[str] = []
    for build in builds:
        if build["command"] not in order:
            order.append(build["command"])
    for command in order:
        rows = sorted((b for b in builds if b["command"] == command), key=lambda b: b["started_utc"], reverse=True)
        lines += [f"### {command}", "",
                  "| load | minutes | of which install | started (UTC) | commit | machine | Snakemake jobs | record |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_cell(c) if not c.startswith("[") else c for c in build_row(b)) + " |"
                  for b in rows]
        lines.append("")
    return lines


def _stages_section(builds: list[dict]) -> list[str]:
    """Per stage: for each command, its latest build with Snakemake jobs, summed per rule."""
    lines: list[str] = []
    latest: dict[str, dict] = {}
    for build in builds:  # oldest first: the last one kept is the latest
        if build["jobs"]:
            latest[build["command"]] = build
    for command, build in latest.items():
        rows = per_rule(build["jobs"])
        total = sum(s for _, _, s in rows)
        lines += [f"## Per stage: the latest `{command}`", "",
                  f"{build['started_utc'].replace('T', ' ').replace('Z', '')} UTC, commit {build['commit'] or 'unknown'},"
                  f" {build['load']['verdict']}; each rule's Snakemake jobs and their seconds summed (jobs that",
                  "ran side by side count each, so the sum can exceed the build's wall time).", "",
                  "| rule | jobs | seconds | mean seconds |", "|---|---|---|---|"]
        lines += [f"| {rule} | {n} | {s:.1f} | {s / n:.1f} |" for rule, n, s in rows]
        lines += [f"| (every rule) | {sum(n for _, n, _ in rows)} | {total:.1f} | |", ""]
    return lines


def _legacy_section(record: dict) -> list[str]:
    lines = [
        "## Before the records: the hand-kept measurements (frozen)",
        "",
        "Measurements typed into [`bench/results/durations.yaml`](../bench/results/durations.yaml)",
        "before builds recorded themselves: the frozen legacy record, kept as it was; nothing is",
        "added to it. *Idle*: nothing else ran on the machine; *busy*: other jobs shared its",
        "cores (as the person measuring judged). An empty date or commit means the measurement",
        "did not record it.",
        "",
    ]
    order: list[str] = []
    for entry in record["durations"]:
        if entry["command"] not in order:
            order.append(entry["command"])
    for command in order:
        entries = [e for e in record["durations"] if e["command"] == command]
        entries.sort(key=lambda e: str(e["date"] or ""), reverse=True)
        entries.sort(key=lambda e: LOADS.index(e["load"]))
        lines += [f"### {command}", "",
                  "| load | minutes | date | commit | machine | note | source |",
                  "|---|---|---|---|---|---|---|"]
        for e in entries:
            lines.append("| " + " | ".join([e["load"], _minutes(e), _cell(e["date"]), _cell(e["commit"]),
                                             _cell(e["machine"]), _cell(e["note"]), _cell(e["source"])]) + " |")
        lines.append("")
    lines += ["### The machines of the legacy record", "", "| machine | what it is |", "|---|---|"]
    lines += [f"| {name} | {_cell(text)} |" for name, text in record["machines"].items()]
    return lines


def render(record: dict, builds: list[dict]) -> str:
    """The Markdown page: the recorded builds per command (newest first), the latest build's
    time per stage, then the legacy record per command (idle first, then newest first)."""
    lines = _header() + _builds_section(builds) + _stages_section(builds) + _legacy_section(record)
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.write(render(load_record(), load_builds()))


if __name__ == "__main__":
    main()
