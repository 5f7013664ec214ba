"""Checks the Snakefile runs before any job, so that problems are named in one line
instead of surfacing as a failed job, a traceback or a silent gap in a table.

* ``check_data``: the active profile's data set is whole (meta.json and both array
  files): a damaged file is re-created identical to its record, with an old mtime so
  nothing re-runs; a dry run only says what it would do.
* ``hold_run_lock``: one Snakemake that can write works in a folder at a time: it holds
  an exclusive kernel lock on ``.snakemake/darel.run`` for its lifetime, and a second one
  stops in one line naming the first, before it builds its DAG (so before Snakemake's own
  clean-up could remove the first one's locks). Dry runs and the other reading modes
  (``--summary``, ``--list-*``, ``--dag``, ``--lint``) only read and are let through.
* ``check_links``: no link in ``data/`` (but ``data/raw``), ``runs/``, ``results/``,
  ``logs/``, ``mlartifacts/`` or at the store's files leads out of the project; a job
  would write through it (darel.io.inside_project stops each writer too).
* ``clear_stale_locks``: the locks a killed Snakemake left (Snakemake itself would stop
  with a LockException until ``--unlock``) are removed when no other Snakemake works in
  this folder; every Snakemake of this workflow holds a shared lock on
  ``.snakemake/darel.live`` for its lifetime, and the kernel drops it when the process
  dies, even by kill -9.
* ``rebuild_missing``: an intermediate file missing under an existing table is made
  again with everything that depends on it (Snakemake alone would say "Nothing to be
  done": it only rebuilds a missing intermediate when something downstream must run).
* ``announce_raw_inputs`` / ``check_device``: what a profile needs from outside (an
  archive to download, a CUDA GPU) is said before the job list, and a download that
  fails stops the run in one line.

The per-table file lists (``table1_files`` and the like) are every file a table is made
from; the table rules take them as inputs, and tests compare them with Snakemake's own
``--summary`` of the DAG.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from darel import config as dconfig
from darel.layout import Layout

_SAID: set[str] = set()
_REPAIRED_HERE: set[str] = set()  # data files check_data re-creates (or would): not rebuilt by their job


def say(line: str, key: str | None = None) -> None:
    """One line on stderr, once per process (input functions may be evaluated repeatedly)."""
    key = key or line
    if key not in _SAID:
        _SAID.add(key)
        print(line, file=sys.stderr, flush=True)


def is_main_process(workflow: Any) -> bool:
    """True for the Snakemake a user started (not one that runs a single job for an executor)."""
    from snakemake_interface_executor_plugins.settings import ExecMode

    return getattr(workflow, "exec_mode", ExecMode.DEFAULT) == ExecMode.DEFAULT


def is_dry_run(workflow: Any) -> bool:
    settings = getattr(workflow, "output_settings", None)
    return bool(getattr(settings, "dryrun", False))


# ---- the data set ----------------------------------------------------------------------------

def check_data(cfg: dict, layout: Layout, workflow: Any, raw: str = "data/raw") -> None:
    """Repair the active profile's damaged data files before the DAG is built (or, in a dry
    run, say which would be repaired); ConfigError when they cannot be re-created here."""
    from darel.data import DataUnavailable, repair_dataset

    dry = is_dry_run(workflow)
    try:
        repaired = repair_dataset(layout.data, dconfig.dataset_params(cfg), raw, dry_run=dry)
    except DataUnavailable as err:
        raise dconfig.ConfigError(str(err)) from None
    for name in repaired:
        _REPAIRED_HERE.add(layout.data_file(name))
        verb = "would be re-created (not in a dry run)" if dry else "re-created"
        say(f"{layout.data_file(name)} was damaged or missing: {verb} identical to what the data stage wrote, "
            "so nothing that depends on it re-runs")


# ---- one writing Snakemake per folder ------------------------------------------------------------

# Snakemake options that only read (the DAG, summaries, lists): never refused.
READING_OPTIONS = ("-n", "--dry-run", "--dryrun", "--summary", "-S", "--detailed-summary", "-D", "--list", "-l",
                   "--list-rules", "--list-target-rules", "--lt", "--dag", "--rulegraph", "--filegraph", "--d3dag",
                   "--lint", "--list-changes", "--lc", "--list-input-changes", "--li", "--list-params-changes", "--lp",
                   "--list-code-changes", "--list-untracked", "--lu", "--print-compilation", "--compile")


class Refusal(RuntimeError):
    """The workflow refuses to start; the message is one line saying why and what to do."""


def reads_only(workflow: Any, argv: list[str] | None = None) -> bool:
    """A dry run or a Snakemake mode that only reads (summary, lists, graphs, lint)."""
    if is_dry_run(workflow):
        return True
    args = sys.argv[1:] if argv is None else argv
    for arg in args:
        if arg in READING_OPTIONS or (arg.startswith("-") and not arg.startswith("--") and len(arg) > 2
                                      and "n" in arg[1:] and arg[1:].isalpha()):  # -pn, -np
            return True
    return False


def hold_run_lock(workflow: Any, folder: str | os.PathLike = ".snakemake") -> bool:
    """Take the folder's writer lock for the life of this Snakemake (True), or raise
    Refusal naming the Snakemake that holds it. Dry runs and reading modes take none
    (False); neither do the Snakemakes an executor starts for single jobs."""
    from darel.io import OutputError, open_lock
    from darel.stagekit.watchdog import describe_holder, stop_advice, take_lock

    if not is_main_process(workflow) or reads_only(workflow) or _RUN:
        return False
    try:
        handle = open_lock(Path(folder) / "darel.run")
    except OutputError as err:
        raise Refusal(str(err)) from None
    holder = take_lock(handle)
    if holder is not None:
        raise Refusal(f"another Snakemake ({describe_holder(holder)}) is working in this folder: wait for it to end, "
                      f"or stop it ({stop_advice(holder)}); a dry run (snakemake -n) may run beside it "
                      "(nothing was run)")
    _RUN.append(handle)
    return True


_RUN: list = []  # the writer lock, held for the life of this Snakemake


# ---- links out of the project ----------------------------------------------------------------------

WRITTEN_FOLDERS = ("data", "runs", "results", "logs", "mlartifacts")
READ_ONLY_INPUTS = ("data/raw",)  # the user's archives: may be links to wherever they keep them


def check_links(store_files: Iterable[str | os.PathLike] = (), root: str | os.PathLike = ".") -> None:
    """Refuse (Refusal, one line naming the first link and counting the others) a link in
    a folder the workflow writes, or at the store's files, that leads out of the project."""
    from darel.io import OutputError, inside_project

    root = Path(root)
    skip = {os.path.normpath(root / name) for name in READ_ONLY_INPUTS}
    found: list[str] = []

    def judge(path: Path) -> None:
        try:
            inside_project(path, root)
        except OutputError as err:
            found.append(str(err))

    judge(root / ".snakemake")  # Snakemake's own records (its shadow folders may hold links inside)
    for name in WRITTEN_FOLDERS:
        top = root / name
        judge(top)
        if top.is_symlink() or not top.is_dir():
            continue
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(folder, d)) not in skip]
            for entry in dirs + files:
                path = Path(folder) / entry
                if path.is_symlink():
                    judge(path)
    for path in store_files:
        judge(Path(path))
    if found:
        more = f" (and {len(found) - 1} more link(s) leading out)" if len(found) > 1 else ""
        raise Refusal(found[0] + more)


def store_files(cfg: dict) -> list[str]:
    """The files of the MLflow store the jobs write: an SQLite database and its lock."""
    from darel.tracking import lock_path_for

    lock = lock_path_for(cfg["tracking"]["uri"])
    return [] if lock is None else [str(lock.with_name(lock.name[: -len(".lock")])), str(lock)]


# ---- stale Snakemake locks ---------------------------------------------------------------------

_LIVE: list = []  # the open lock file, held for the life of this Snakemake


def clear_stale_locks(workflow: Any, folder: str | os.PathLike = ".snakemake") -> list[str]:
    """Remove Snakemake's locks when no other Snakemake of this workflow is alive here;
    then hold the shared live-lock until this process ends. Returns the removed files."""
    if not is_main_process(workflow) or _LIVE:
        return []
    from darel.io import OutputError, open_lock

    folder = Path(folder)
    try:
        handle = open_lock(folder / "darel.live")
    except OutputError as err:
        raise Refusal(str(err)) from None
    removed: list[str] = []
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # another Snakemake runs here: its locks are live, Snakemake's own check applies
    else:
        locks = folder / "locks"
        stale = sorted(p for p in locks.glob("*.lock")) if locks.is_dir() else []
        if stale and is_dry_run(workflow):
            say(f"{len(stale)} lock file(s) in {locks} were left by a Snakemake that was killed; the next run (not a "
                "dry run) removes them")
        elif stale:
            for path in stale:
                path.unlink(missing_ok=True)
            removed = [str(p) for p in stale]
            say(f"removed {len(stale)} lock file(s) in {locks} left by a Snakemake that was killed (no other Snakemake "
                "is running in this folder)")
    fcntl.flock(handle.fileno(), fcntl.LOCK_SH)  # converts the exclusive lock, or waits for none
    _LIVE.append(handle)
    return removed


# ---- missing intermediates -----------------------------------------------------------------------

def built_cells(table: str, profile: str) -> set[tuple[str, int, str]] | None:
    """(model, seed, cell) of every row the existing ``table`` CSV holds for ``profile`` (a
    row's ``seeds`` when it averages several, else its ``seed``); None when the table cannot
    be read or lacks those columns (then every cell counts as built)."""
    import csv

    try:
        with open(table, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    if not rows or not {"model", "cell", "profile"} <= set(rows[0]) or not ({"seed", "seeds"} & set(rows[0])):
        return None
    found: set[tuple[str, int, str]] = set()
    try:
        for row in rows:
            if row["profile"] == profile:
                seeds = (row.get("seeds") or row.get("seed") or "").split()
                found.update((row["model"], int(float(seed)), row["cell"]) for seed in seeds)
    except ValueError:
        return None
    return found


def new_cell_files(cells: dict[tuple[str, int, str], list[str]], built: set[tuple[str, int, str]] | None) -> set[str]:
    """The files only cells that the existing table does not hold yet are made from
    (``cells``: (model, seed, cell) -> its files). Missing, they are a new cell's results to
    build, not a damage to repair."""
    if built is None:
        return set()
    old = {str(f) for key, files in cells.items() if key in built for f in files}
    return {str(f) for key, files in cells.items() if key not in built for f in files} - old


def rebuild_missing(workflow: Any, table: str, files: Iterable[str], new_files: Iterable[str] = (),
                    new_cells: Iterable[str] = ()) -> list[str]:
    """Under an existing ``table``, force the jobs that write the missing ``files``
    (called from the table rule's input function, while Snakemake builds its DAG); the
    jobs downstream of them follow, the table last. Files only new cells are made from
    (``new_files``; ``new_cells`` names those cells) are not forced: the table's own list of
    cells changed, so Snakemake plans them as results to build, and that is said instead.
    Returns the missing files that are forced."""
    if not is_main_process(workflow) or not Path(table).exists():
        return []
    new_files = {str(f) for f in new_files}
    new_cells = list(new_cells)
    if new_cells:
        shown = ", ".join(new_cells[:4]) + (f" and {len(new_cells) - 4} more" if len(new_cells) > 4 else "")
        verb = "would be built (dry run)" if is_dry_run(workflow) else "are built"
        say(f"{table}: {len(new_cells)} new cell(s), not in the table yet ({shown}): {verb} like any result not made "
            "yet, then the table; no cell already in it re-runs", key=f"new:{table}")
    missing = sorted({str(f) for f in files if not Path(f).exists() and str(f) not in _REPAIRED_HERE
                      and str(f) not in new_files})
    if not missing:
        return []
    workflow.dag.forcefiles.update(missing)
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
    verb = "would re-create (dry run)" if is_dry_run(workflow) else "re-creating"
    say(f"{table}: {len(missing)} of the files it is made from are missing ({shown}); {verb} them and what depends "
        "on them", key=f"missing:{table}")
    return missing


def _data_files(layout: Layout) -> list[str]:
    return [layout.data_file(name) for name in ("train.npz", "test.npz", "meta.json")]


def _table1_cell_files(cfg: dict, layout: Layout, model: str, seed: int, cell: str) -> list[str]:
    run = lambda name, cell=cell, model=model: layout.table1(name, model=model, seed=seed, cell=cell)  # noqa: E731
    files = [run(name) for name in ("model.pt", "train.json", "eval.json", "carbon.json", "mlflow.json")]
    files.append(layout.table1_cell(model=model, seed=seed, cell=cell))
    if cell != dconfig.TABLE1_BASELINE:
        files += [layout.table1_settings(model=model, seed=seed, cell=cell), run("subset.npz"),
                  run("train.json", cell=dconfig.TABLE1_BASELINE)]
        scorer = dconfig.scorer_of(cfg, model)
        if cell != dconfig.IDS_ADONIS:
            files += [run(name, cell=dconfig.TABLE1_BASELINE, model=scorer)
                      for name in ("losses.npz", "model.pt", "train.json")]
        else:
            files += [run(name, cell=dconfig.TABLE1_BASELINE) for name in ("model.pt", "train.json")]
    return files


def table1_files(cfg: dict, layout: Layout) -> list[str]:
    """Every file results/table1.csv is made from, in a stable order without repeats."""
    files = _data_files(layout)
    for model, seed, cell in dconfig.table1_cells(cfg):
        files += _table1_cell_files(cfg, layout, model, seed, cell)
    return list(dict.fromkeys(files))


def table1_new_cells(cfg: dict, layout: Layout, table: str = "results/table1.csv") -> tuple[list[str], set[str]]:
    """The Table 1 cells of the active profile that the existing ``table`` does not hold
    yet ("<model>/s<seed>/<cell>"), and the files only they are made from."""
    cells = {(model, seed, cell): _table1_cell_files(cfg, layout, model, seed, cell)
             for model, seed, cell in dconfig.table1_cells(cfg)}
    built = built_cells(table, cfg["profile"]) if Path(table).exists() else None
    if built is None:
        return [], set()
    return [f"{m}/s{s}/{c}" for m, s, c in cells if (m, s, c) not in built], new_cell_files(cells, built)


def study_table1_files(cfg: dict, layout: Layout) -> list[str]:
    """Every file results/study_table1.csv is made from: the baselines' Table 1 cells, each
    method's run with the inputs it takes from Table 1 (DAREL's own Table 1 cells when the
    study's schedule rule is Table 1's), and the scorer's records its reports charge."""
    files = _data_files(layout)
    own_darel = not dconfig.study_trains_darel(cfg)
    for model, seed, cell, method in dconfig.study_table1_cells(cfg):
        files += _table1_cell_files(cfg, layout, model, seed, dconfig.TABLE1_BASELINE)
        if method == "darel" and own_darel:
            files += _table1_cell_files(cfg, layout, model, seed, cell)
            continue
        t1 = lambda name, cell=cell, model=model: layout.table1(name, model=model, seed=seed, cell=cell)  # noqa: E731
        scorer = [t1(name, cell=dconfig.TABLE1_BASELINE, model=dconfig.scorer_of(cfg, model))
                  for name in ("losses.npz", "model.pt", "train.json")]
        files += [*method_inputs(layout, model, seed, cell, method).values(), *scorer]
        study = lambda name: layout.study(name, model=model, seed=seed, cell=cell, method=method)  # noqa: E731
        files += [study(name) for name in ("model.pt", "train.json", "plan.json", "eval.json", "carbon.json",
                                           "mlflow.json")]
        files.append(layout.study_cell(model=model, seed=seed, cell=cell, method=method))
    return list(dict.fromkeys(files))


def method_inputs(layout: Layout, model: object, seed: object, cell: object, method: str) -> dict[str, str]:
    """What a study method's training reads besides the data: the cell's calibration and its
    training set (DAREL's offline subset, one the study draws, none for all data)."""
    from darel import methods

    t1 = lambda name: layout.table1(name, model=model, seed=seed, cell=cell)  # noqa: E731
    found = {"calibration": t1("calibration.json")}
    subset = methods.get(method).subset
    if subset == methods.SCORER_SUBSET:
        found["subset"] = t1("subset.npz")
    elif subset != methods.FULL_DATA:
        found["subset"] = layout.study_subset(subset, model=model, seed=seed, cell=cell)
    return found


def _nlg_cell_files(cfg: dict, layout: Layout, table: str, model: str, seed: int, cell: str) -> list[str]:
    dataset = cfg[table]["dataset"]
    shared = lambda name: layout.nlg_shared(name, dataset=dataset)  # noqa: E731
    files = [layout.nlg_data(name, dataset=dataset) for name in ("train.jsonl", "dev.jsonl", "test.jsonl",
                                                                  "test_refs.txt", "meta.json")]
    files += [shared("tokenizer"), shared(f"{model}/pretrained")]
    run = lambda name: layout.nlg_run(name, table=table, model=model, seed=seed, cell=cell)  # noqa: E731
    files += [run(name) for name in ("adapter", "hyps.txt", "eval.json", "carbon.json", "mlflow.json")]
    files.append(layout.nlg_cell(table=table, model=model, seed=seed, cell=cell))
    if cell != dconfig.NLG_BASELINE and dconfig.split_nlg_cell(cell)[1] != "random":
        scorer = cfg["nlg"]["scorer"]
        files += [shared("scorer_losses.npz"), shared(f"{scorer}/pretrained")]
        if scorer in cfg[table]["models"]:  # the scorer's batches grow to the memory its fine-tuning measured
            files += _nlg_cell_files(cfg, layout, table, scorer, dconfig.seeds(cfg)[0], dconfig.NLG_BASELINE)
    return files


def nlg_table_files(cfg: dict, layout: Layout, table: str) -> list[str]:
    files: list[str] = []
    for model, seed, cell in dconfig.nlg_cells(cfg, table):
        files += _nlg_cell_files(cfg, layout, table, model, seed, cell)
    return list(dict.fromkeys(files))


def study_nlg_files(cfg: dict, layout: Layout, table: str) -> list[str]:
    files: list[str] = []
    for model, seed, cell in dconfig.study_nlg_cells(cfg, table):
        files += _nlg_cell_files(cfg, layout, table, model, seed, cell)
    return list(dict.fromkeys(files))


# ---- what a profile needs from outside ----------------------------------------------------------

def announce_raw_inputs(cfg: dict, layout: Layout, workflow: Any, raw: str = "data/raw",
                        fetch: Callable[[str], Any] | None = None) -> list[str]:
    """Called when the data set must be built: for a data set downloaded from the network
    (CIFAR-100), say which archive is missing and from where it comes; in a real run fetch
    it now, so that a network failure stops the run in one line before any job."""
    from darel import data

    params = dconfig.dataset_params(cfg)
    if params["dataset"] != "cifar100":
        return []
    archive = Path(raw) / data.CIFAR100_ARCHIVE_NAME
    if archive.is_file() and (Path(layout.data) / data.META_FILE).exists():
        return []
    if not archive.is_file():
        say(f"missing input: {archive} (CIFAR-100, {data.CIFAR100_URL}, MD5 {data.CIFAR100_MD5}); "
            + ("the download job fetches it (or put the file in "
               f"{Path(raw).resolve()}/)" if is_dry_run(workflow) else "downloading it now"))
    if is_dry_run(workflow) or not is_main_process(workflow):
        return [str(archive)]
    try:
        (fetch or (lambda folder: data.fetch_cifar100(folder, progress=True)))(raw)
    except data.DataUnavailable as err:
        sys.exit(str(err))
    return [str(archive)]


def announce_nlg_inputs(cfg: dict, dataset: str, workflow: Any, raw: str = "data/raw") -> list[str]:
    """The official E2E / WebNLG release a paper-profile language table downloads, and the
    hub weights it loads: said before the job list when absent here."""
    params = dconfig.nlg_data_params(cfg, dataset)
    if params["synthetic"]:
        return []
    from darel.nlg import readers

    url, name = ((readers.E2E_URL, readers.E2E_ARCHIVE_NAME) if dataset == "e2e"
                 else (readers.WEBNLG2017_URL, readers.WEBNLG2017_ARCHIVE_NAME))
    archive = Path(raw) / dataset / name
    if archive.is_file():
        return []
    say(f"missing input: {archive} ({dataset}, {url}); the nlg_data job downloads it (or put the file in "
        f"{archive.parent.resolve()}/); the GPT-2 weights come from the Hugging Face hub (network or a filled "
        "HF cache)", key=f"nlg:{dataset}")
    return [str(archive)]


def check_device(cfg: dict, workflow: Any) -> None:
    """A profile that asks for a CUDA GPU where torch sees none: said in a dry run; a real
    run with jobs on this machine stops in one line (an executor that sends jobs to other
    machines, e.g. Slurm, is left to them)."""
    profile = cfg["profile"]
    if cfg["profiles"][profile]["device"] != "cuda" or not is_main_process(workflow):
        return
    import torch

    if torch.cuda.is_available():
        return
    line = (f"profile {profile} needs a CUDA GPU (profiles.{profile}.device = cuda) and torch sees none on this "
            "machine")
    if is_dry_run(workflow) or not getattr(workflow, "local_exec", True):
        say(f"{line}: its training jobs must run where there is one", key="device")
        return
    sys.exit(f"{line}; nothing was run (run it on a GPU machine, or choose the quick profile)")
