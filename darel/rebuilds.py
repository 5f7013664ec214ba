"""Two builds of one cell: do they agree on their results?

A cell is built again when its record is deleted, its inputs or parameters change, a
user forces it, or another clone logs to the same MLflow store. Its times, energy and
memory differ from build to build by nature; its results (weights, outputs, scores,
counts) must not, given the same inputs. The record's ``results_sha256``
(darel.records.MEASUREMENTS, darel.provenance.seal_results) separates the two.

Where a user meets two builds: the MLflow store. The tracking stage tags every cell's run
with its ``results_sha256``, and a later build's run replaces it (the earlier run is
deleted, not erased: MLflow keeps it until ``mlflow gc``). So the table stages compare each
cell's record with the previous finished run of the same cell key in the same store, and
say in one line per cell when the two disagree, naming the results that differ, the
earlier run, and the code it was built from. A disagreement after a change of code or
parameters can be expected; with neither, it is a reproducibility failure.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any, Callable

from darel import provenance, records

RESULTS_TAG = provenance.RESULTS_KEY
_SHOWN = 3  # differing results named per line


def cell_key(record: dict) -> str:
    """A table cell's key in its MLflow experiment (profile/model/s<seed>/<cell>)."""
    return "/".join([str(record["profile"]), str(record["model"]), f"s{record['seed']}", str(record["cell"])])


def previous_build(runs: list[dict], results: str) -> dict | None:
    """Of a cell's finished runs (newest first, each {"results_sha256", ...}), the one of
    the build before this one: the newest is this build's own when it carries this
    record's hash; runs without a hash (tracked before records carried one) are skipped."""
    hashed = [run for run in runs if run.get(RESULTS_TAG)]
    if hashed and hashed[0][RESULTS_TAG] == results:
        hashed = hashed[1:]
    return hashed[0] if hashed else None


def _differing(record: dict, metrics: dict[str, float]) -> list[str]:
    """The results that the earlier run logged as metrics and that differ from ``record``."""
    measured = {name.split(".")[0] for name in records.MEASUREMENTS}
    out = []
    for name, old in sorted(metrics.items()):
        new = record.get(name)
        if name in measured or isinstance(new, bool) or not isinstance(new, (int, float)):
            continue
        if not (new == old or (isinstance(old, float) and math.isnan(old) and math.isnan(float(new)))):
            out.append(f"{name} {new:.6g} vs {old:.6g}")
    return out


def disagreement(key: str, record: dict, earlier: dict) -> str | None:
    """One line saying how this build of ``key`` and ``earlier`` (a run: its id, start
    time, commit, results hash and metrics) disagree on results; None when they agree."""
    ours = record[provenance.RESULTS_KEY]
    if earlier[RESULTS_TAG] == ours:
        return None
    named = _differing(record, earlier.get("metrics", {}))
    what = ", ".join(named[:_SHOWN]) + (f" and {len(named) - _SHOWN} more" if len(named) > _SHOWN else "")
    when = datetime.fromtimestamp(earlier["start_ms"] / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = str(earlier.get("git_commit") or "unknown")[:10] + (" (uncommitted changes)"
                                                                   if earlier.get("git_dirty") == "true" else "")
    return (f"{key}: results differ from its previous build (MLflow run {earlier['run_id'][:12]} of {when}, code "
            f"{commit}): {what or 'fields not logged to MLflow'}; results_sha256 {ours[:12]}... vs "
            f"{earlier[RESULTS_TAG][:12]}...")


def earlier_runs(tracking_uri: str, experiment: str, profile: str) -> dict[str, list[dict]]:
    """Per cell key, the finished runs of this profile's cells in ``experiment`` (deleted
    ones included: a rebuild deletes the run it replaces), newest first."""
    from mlflow.entities import ViewType

    from darel import tracking

    with tracking._store(tracking_uri) as (client, _):
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return {}
        runs = client.search_runs([found.experiment_id], filter_string=tracking._scope_filter()
                                  + f" and tags.profile = '{profile}' and tags.state = 'finished'",
                                  run_view_type=ViewType.ALL, max_results=50_000,
                                  order_by=["attributes.start_time DESC"])
    by_key: dict[str, list[dict]] = {}
    for run in runs:
        tags = run.data.tags
        by_key.setdefault(tags.get("cell_key", ""), []).append({
            "run_id": run.info.run_id, "start_ms": run.info.start_time or 0, RESULTS_TAG: tags.get(RESULTS_TAG),
            "git_commit": tags.get("git_commit"), "git_dirty": tags.get("git_dirty"), "metrics": dict(run.data.metrics)})
    return by_key


def compare_with_earlier_builds(tracking_uri: str, experiment: str, profile: str, cells: dict[str, dict],
                                say: Callable[[str], Any], warn: Callable[[str], Any]) -> list[str]:
    """``cells`` (path -> record) against the previous build of each in the MLflow store:
    ``warn`` one line per disagreeing cell, ``say`` one summary line; returns the lines of
    disagreement. A record whose results no longer match its hash stops the table."""
    runs = earlier_runs(tracking_uri, experiment, profile)
    lines, compared, unhashed = [], 0, 0
    for path, record in cells.items():
        if provenance.check_results(record, records.MEASUREMENTS, path) is None:
            unhashed += 1
            continue
        key = cell_key(record)
        earlier = previous_build(runs.get(key, []), record[provenance.RESULTS_KEY])
        if earlier is None:
            continue
        compared += 1
        line = disagreement(key, record, earlier)
        if line:
            lines.append(line)
            warn(line)
    say(f"{experiment}: {compared - len(lines)} of {compared} cells with an earlier build in the MLflow store agree "
        f"with it on results ({len(cells) - compared - unhashed} built once"
        + (f", {unhashed} written before records carried results_sha256" if unhashed else "") + ")")
    return lines


def read_table_cells(args: Any, log: Any, experiment: str) -> list[dict]:
    """A table stage's cell records (``--cells``), each checked against the records it
    summarises (``stagekit.read_cells``) and, with ``--tracking-uri``, against its previous
    build in ``experiment`` of the store (``check_table``: one line per disagreement)."""
    from darel.stagekit import read_cells

    cells = read_cells(args.cells)
    if args.tracking_uri:
        check_table(args, log, experiment, args.cells, cells)
    return cells


def check_table(args: Any, log: Any, experiment: str, paths: list[str], cells: list[dict]) -> list[str]:
    """A table stage's comparison (``--tracking-uri``, ``--profile``); an unreadable store or a
    record whose results no longer match its hash stops the stage in one line."""
    from darel.stagekit import fail
    from darel.tracking import TrackingError

    try:
        return compare_with_earlier_builds(args.tracking_uri, experiment, args.profile, dict(zip(paths, cells)),
                                           log.info, log.warning)
    except TrackingError as err:
        fail(log, f"MLflow: {err}")
    except provenance.ArtifactError as err:
        fail(log, str(err))
    return []
