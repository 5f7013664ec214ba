"""No input runs code or escapes the project, and no edited result passes unseen: real
Snakemake runs of a tiny project, attacked as docs/security.md describes."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from darel import checkpoint
from tests.conftest import built_project_fixtures, one_budget_table1, run_in, tiny_project

pytestmark = pytest.mark.slow

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
CELL = "runs/quick/table1/resnet18/s0/t0.50_m0.55"
CELL_JSON = "results/cells/quick/table1/resnet18/s0/t0.50_m0.55.json"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot(root: Path) -> dict[str, str]:
    """Every file of the project but Snakemake's own caches and the git folder, by content."""
    return {str(p.relative_to(root)): _sha(p) for p in sorted(root.rglob("*"))
            if p.is_file() and not str(p.relative_to(root)).startswith((".git/", ".snakemake/iocache",
                                                                        ".snakemake/log"))}


built, project = built_project_fixtures("secure")  # a built project, and a copy per test


# ---- values that reach paths and shell commands ---------------------------------------------

def _payloads(outside: Path) -> list[tuple[str, dict | None, list[str]]]:
    """(what, params.yaml edit, --config arguments), each trying to run `touch` or write outside."""
    marker = outside / "code-ran"
    def profile(name):  # noqa: E306 - the quick profile renamed
        def edit(params):
            params["profiles"][name] = params["profiles"].pop("quick")
            params["profile"] = name
            return params
        return edit
    def uri(value):  # noqa: E306
        def edit(params):
            params["tracking"]["uri"] = value
            return params
        return edit
    return [
        ("profile with ;", profile(f"q;touch {marker};#"), []),
        ("profile with $()", profile(f"q$(touch {marker})"), []),
        ("profile with backticks", profile(f"q`touch {marker}`"), []),
        ("profile with a newline", profile(f"q\ntouch {marker}"), []),
        ("profile traversal", profile(f"../../../../../../..{outside}/evil"), []),
        ("absolute profile", profile(str(outside / "evil")), []),
        ("look-alike profile", profile("qu\u0131ck"), []),
        ("tracking uri with $()", uri(f"sqlite:///mlflow.db$(touch {marker})"), []),
        ("tracking uri with backticks", uri(f"sqlite:///mlflow.db`touch {marker}`"), []),
        ("tracking uri outside", uri(f"sqlite:///../../../../../../..{outside}/mlflow.db"), []),
        ("--config profile", None, ["--config", f"profile=q;touch {marker}"]),
        ("--config tracking uri", None, ["--config", f"tracking={{uri: 'sqlite:///m.db;touch {marker}'}}"]),
        # Absurd values (tests/test_config.py has the whole table; these go through Snakemake).
        ("a 100 kB tracking uri", uri("sqlite:///" + "a" * 100_000), []),
        ("billion laughs", None, ["--config", "controls=[&a [x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], "
                                  "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], "
                                  "&e [*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e], "
                                  "&g [*f,*f,*f,*f,*f,*f,*f,*f,*f], &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]]"]),
    ]


def test_injections_and_traversals_stop_in_one_line_before_any_job(tmp_path):
    project = tiny_project(tmp_path / "project", one_budget_table1)
    outside = tmp_path / "outside"
    outside.mkdir()
    committed = (project / "params.yaml").read_text()
    before = _snapshot(project)
    for what, edit, extra in _payloads(outside):
        params = yaml.safe_load(committed)
        (project / "params.yaml").write_text(yaml.safe_dump(edit(params) if edit else params, sort_keys=False))
        out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv", *extra, check=False)
        text = out.stdout + out.stderr
        assert out.returncode != 0, what
        errors = [line for line in text.splitlines() if line.startswith("params: ")]
        assert len(errors) == 1 and "(nothing was run" in text, (what, text[-2000:])
        assert len(errors[0]) <= 240 and len(text) < 2000, (what, text[:2000])
        assert "Traceback" not in text, what
        assert list(outside.iterdir()) == [], (what, list(outside.iterdir()))
        for folder in ("data", "runs", "logs", "results/cells"):
            assert not (project / folder).exists(), (what, folder)
    (project / "params.yaml").write_text(committed)
    after = _snapshot(project)
    assert {k: v for k, v in after.items() if not k.startswith(".snakemake")} == \
        {k: v for k, v in before.items() if not k.startswith(".snakemake")}


# ---- a crafted checkpoint ---------------------------------------------------------------------

class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_crafted_checkpoint_runs_no_code_and_the_run_starts_clean(project, tmp_path):
    original = _sha(project / CELL / "model.pt")
    marker = tmp_path / "code-ran"
    buffer = io.BytesIO()
    torch.save({"fingerprint": "anything", "model": _RunsCode(marker)}, buffer)
    payload = buffer.getvalue()  # sealed with the user's own key: what refuses it is the unpickler
    (project / CELL / "ckpt.pt").write_bytes(checkpoint.sealed(payload))
    for name in ("model.pt", "train.json"):
        (project / CELL / name).unlink()
    out = run_in(project, SNAKEMAKE, "--cores", "2", "results/table1.csv")
    assert not marker.exists()
    log = (project / "logs/quick/table1/resnet18/s0/t0.50_m0.55/train.log").read_text()
    assert "ckpt.pt is damaged" in log and "refused unread" in log and "starting clean" in log, log[-2000:]
    for start_up in (" s since the process started", "data set on cpu: ", "energy tracker started in "):
        assert start_up in log, start_up  # a job's start-up, phase by phase (bench/README.md "On a GPU")
    assert _sha(project / CELL / "model.pt") == original  # trained again from scratch: the same weights
    assert "missing" in out.stderr


# ---- edited or damaged artifacts ---------------------------------------------------------------

DAMAGE = [  # (file, the rule that re-creates it)
    (f"{CELL}/model.pt", "train_online"),
    ("runs/quick/table1/resnet18/s0/baseline/losses.npz", "score_losses"),
    (f"{CELL}/subset.npz", "materialise_subset"),
    (f"{CELL}/calibration.json", "calibrate"),
    (CELL_JSON, "cell_record"),
    ("runs/quick/table1/resnet18/s0/baseline/train.json", "pretrain_scorer"),
]


@pytest.mark.parametrize("name, rule", DAMAGE, ids=[Path(n).name for n, _ in DAMAGE])
def test_one_flipped_byte_stops_the_workflow_naming_the_file_and_its_rule(project, name, rule):
    path = project / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    out = run_in(project, SNAKEMAKE, "--cores", "2", "results/table1.csv", check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert re.search(rf"{re.escape(name)}: .*rule {rule} re-creates it", text), text[-3000:]


def test_an_edited_figure_in_a_cell_record_never_reaches_the_table(project):
    table = (project / "results/table1.csv").read_text()
    path = project / CELL_JSON
    path.write_text(re.sub(r'"top1": [0-9.]+', '"top1": 99.9', path.read_text()))
    out = run_in(project, SNAKEMAKE, "--cores", "2", "results/table1.csv", check=False)
    assert out.returncode != 0
    assert f"{CELL_JSON}: its content differs from its seal" in out.stdout + out.stderr
    assert (project / "results/table1.csv").read_text() == table


# ---- a shared folder: swapped records, absurd values, secrets (docs/security.md) -----------------------

BASELINE = "runs/quick/table1/resnet18/s0/baseline"


@contextlib.contextmanager
def _refusing_database():
    """A TCP port that accepts connections and closes them: the store check passes, every
    client then fails (a stand-in for a PostgreSQL server)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.5)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            with contextlib.suppress(OSError):
                connection, _ = server.accept()
                connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()


def test_a_shared_folder_cannot_swap_records_run_absurd_values_or_leak_the_password(project):
    """One built project, attacked three ways: absurd values (refused before any job,
    nothing deleted), the baseline's records copied into a budget cell (the cell record
    stops, naming both places), a store with a password (refused in one line that hides it,
    from params.yaml and from --config: the password appears nowhere)."""
    before = _snapshot(project)
    for override in ("darel={alpha_default: .nan}", "profiles={quick: {table1: {resnet18: [[1.0e-9, 0.55]]}}}"):
        out = run_in(project, SNAKEMAKE, "--cores", "2", "results/table1.csv", "--config", override, check=False)
        assert out.returncode != 0 and "(nothing was run" in out.stderr, out.stderr[-2000:]
    assert {k: v for k, v in _snapshot(project).items() if not k.startswith(".snakemake")} == \
        {k: v for k, v in before.items() if not k.startswith(".snakemake")}

    table = (project / "results/table1.csv").read_text()
    for name in ("model.pt", "train.json", "eval.json"):
        shutil.copy(project / BASELINE / name, project / CELL / name)  # newer: Snakemake re-runs what reads them
    run = run_in(project, SNAKEMAKE, "--cores", "2", "--keep-going", "results/table1.csv", check=False)
    console = run.stdout + run.stderr
    assert run.returncode != 0
    assert re.search(rf"{CELL}/train\.json: holds the record written as {BASELINE}/train\.json \(cell 'baseline' "
                     r"instead of 't0\.50_m0\.55'", console), console[-3000:]
    assert (project / "results/table1.csv").read_text() == table

    marker = "MARKERpw7f3a"
    committed = (project / "params.yaml").read_text()
    with _refusing_database() as port:  # should the refusal ever go, no job waits on a real server
        uri = f"postgresql://darel:{marker}@127.0.0.1:{port}/mlflow"
        params = yaml.safe_load(committed)
        params["tracking"]["uri"] = uri
        (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        # A password in the URI is refused before the DAG is built (Snakemake would print the
        # --config command line in its banner and its log): in params.yaml, dry run and run,
        # and as a --config override.
        dry = run_in(project, SNAKEMAKE, "-n", "-p", "-F", "results/table1.csv", check=False)
        run = run_in(project, SNAKEMAKE, "--cores", "2", "--keep-going", "-p", "results/table1.csv", check=False)
        (project / "params.yaml").write_text(committed)
        given = run_in(project, SNAKEMAKE, "--cores", "2", "-p", "results/table1.csv", "--config",
                       f"tracking={{uri: '{uri}'}}", check=False)
    for out in (dry, run, given):
        lines = [line for line in out.stderr.splitlines() if line.startswith("params: tracking.uri = ")]
        assert out.returncode != 0 and len(lines) == 1, out.stderr[-3000:]
        assert "'postgresql://darel:***@127.0.0.1" in lines[0] and "PGPASSWORD" in lines[0], lines[0]
    console = "".join(out.stdout + out.stderr for out in (dry, run, given))
    assert marker not in console
    stored = [str(path) for folder in ("logs", ".snakemake", "results", "runs", "mlartifacts")
              for path in (project / folder).rglob("*") if path.is_file() and marker.encode() in path.read_bytes()]
    assert stored == [] and marker.encode() not in (project / "mlflow.db").read_bytes()


# ---- missing intermediates, dry runs, data, locks ----------------------------------------------------

def test_missing_intermediates_under_an_existing_table_are_rebuilt(project):
    weights = _sha(project / CELL / "model.pt")
    for name in (f"{CELL}/model.pt", f"{CELL}/train.json", CELL_JSON):
        (project / name).unlink()
    out = run_in(project, SNAKEMAKE, "--cores", "2", "results/table1.csv")
    assert "results/table1.csv: 3 of the files it is made from are missing" in out.stderr
    assert _sha(project / CELL / "model.pt") == weights and (project / CELL_JSON).exists()
    assert "t0.50_m0.55" in (project / "results/table1.csv").read_text()
    again = run_in(project, SNAKEMAKE, "--cores", "2", "results/table1.csv")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_dry_run_writes_nothing_and_says_what_the_run_would_do(project):
    meta = project / "data/quick/meta.json"
    good_meta = meta.read_bytes()
    meta.write_bytes(b"")  # damaged
    (project / CELL / "carbon.json").unlink()  # a missing intermediate
    locks = project / ".snakemake/locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.input.lock").write_text("results/table1.csv\n")  # left by a killed Snakemake
    before = _snapshot(project)
    dry = run_in(project, SNAKEMAKE, "-n", "results/table1.csv")
    assert _snapshot(project) == before
    text = dry.stdout + dry.stderr
    assert "data/quick/meta.json was damaged or missing: would be re-created" in text
    assert "would re-create (dry run)" in text and "left by a Snakemake that was killed" in text
    real = run_in(project, SNAKEMAKE, "--cores", "2", "results/table1.csv")
    assert meta.read_bytes() == good_meta
    assert not locks.exists() or not list(locks.glob("*.lock"))
    assert "data/quick/meta.json was damaged or missing: re-created" in real.stderr
    assert (project / CELL / "carbon.json").exists()
    assert "cell_record" in real.stdout + real.stderr and "pretrain_scorer" not in real.stdout + real.stderr


def _holder_pid(lock: Path) -> int | None:
    """The PID recorded in a stage's lock, if that process is alive and is a training stage
    (a record left by an earlier, finished run names a dead or unrelated process)."""
    from darel.stagekit.watchdog import _parse_holder

    text = lock.read_text() if lock.exists() else ""
    pid = _parse_holder(text).get("pid", "")
    if not pid.isdigit():
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return int(pid) if b"train_online" in cmdline else None


def test_a_second_snakemake_is_refused_and_a_killed_one_needs_no_unlock(project):
    # The copy keeps the built run's log and lock record: remove them, so that only the new
    # run's training can be taken for the one to hold still.
    for name in (f"{CELL}/model.pt", f"{CELL}/train.json", f"{CELL}/.train_online.lock",
                 "logs/quick/table1/resnet18/s0/t0.50_m0.55/train.log"):
        (project / name).unlink(missing_ok=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen([SNAKEMAKE, "--cores", "1", "results/table1.csv"], cwd=project, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = project / "logs/quick/table1/resnet18/s0/t0.50_m0.55/train.log"
    deadline = time.monotonic() + 1800
    while not (log.exists() and list((project / ".snakemake/locks").glob("*.lock"))
               and _holder_pid(project / CELL / ".train_online.lock")):
        assert proc.poll() is None and time.monotonic() < deadline, "the training never started"
        time.sleep(0.02)
    # P works (its training held still, so it cannot end while we look). A dry run reads
    # beside it; a second Snakemake that would find nothing to do (and so remove every
    # lock of .snakemake/locks) and a third that would start P's job again are refused in
    # one line by the workflow itself, before Snakemake touches anything.
    stage = _holder_pid(project / CELL / ".train_online.lock")
    os.kill(stage, signal.SIGSTOP)
    locks = sorted((project / ".snakemake/locks").glob("*.lock"))
    dry = run_in(project, SNAKEMAKE, "-n", "results/table1.csv")
    assert "another Snakemake" not in dry.stdout + dry.stderr
    for target in ("data/quick/meta.json", "results/table1.csv"):
        refused = run_in(project, SNAKEMAKE, "--cores", "1", target, check=False)
        lines = [line for line in (refused.stdout + refused.stderr).splitlines() if "another Snakemake" in line]
        assert refused.returncode != 0 and len(lines) == 1, refused.stderr[-2000:]
        assert lines[0].startswith(f"another Snakemake (PID {proc.pid} on ") and "(nothing was run)" in lines[0]
    assert sorted((project / ".snakemake/locks").glob("*.lock")) == locks and log.exists() and proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):  # the held training, were it in another process group
        os.kill(stage, signal.SIGKILL)
    proc.wait(timeout=60)
    assert list((project / ".snakemake/locks").glob("*.lock"))  # what Snakemake alone would refuse to run with
    out = run_in(project, SNAKEMAKE, "--cores", "2", "results/table1.csv")
    assert "left by a Snakemake that was killed" in out.stderr and "LockException" not in out.stderr
    assert (project / CELL / "model.pt").exists()


def test_the_preflight_file_lists_are_snakemakes_own_dag(tmp_path):
    """darel.preflight lists every file a table is made from; Snakemake's --summary of the
    same target lists the files of its DAG: the two agree for every table and study."""
    from darel import config, preflight
    from darel.layout import Layout

    def study_params(params):
        params = one_budget_table1(params)
        params["study"]["seeds"] = [0, 1]
        params["study"]["table1"].update(budgets={"quick": [[0.5, 0.55]]},
                                         methods=["darel", "random-offline", "uniform-online", "random",
                                                  "short-schedule", "selective-backprop", "infobatch",
                                                  "darel-restream", "oracle-clean"])
        params["profiles"]["quick"]["table1"]["resnet18_hc"] = [[0.8, 0.8]]
        params["comparisons"] = {"ids_adonis": yaml.safe_load((Path(__file__).parents[1] / "params.yaml")
                                                              .read_text())["comparisons"]["ids_adonis"]}
        return params

    project = tiny_project(tmp_path / "project", study_params)
    cfg = config.load_params(project / "params.yaml")
    layout = Layout("quick")
    targets = {
        "results/table1.csv": preflight.table1_files(cfg, layout),
        "results/study_table1.csv": preflight.study_table1_files(cfg, layout),
        "results/table2.csv": preflight.nlg_table_files(cfg, layout, "table2"),
        "results/study_table3.csv": preflight.study_nlg_files(cfg, layout, "table3"),
    }
    for target, listed in targets.items():
        out = run_in(project, SNAKEMAKE, "--summary", target)
        rows = [line.split("\t") for line in out.stdout.splitlines()[1:] if "\t" in line]
        produced = {row[0] for row in rows}
        own = {row[0] for row in rows if row[2] == rows[0][2]}  # the table job's own outputs
        assert produced - own == set(listed), (target, sorted((produced - own) ^ set(listed)))
