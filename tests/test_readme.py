"""Every command of README.md and of the docs pages it sends a reader to for commands,
run exactly as written and in reading order, in a tiny copy of the project (what a
newcomer types after cloning).

The commands are the lines of the fenced ``sh`` blocks of COMMAND_PAGES, README first.
COMMANDS maps each one to
how it runs here: extra environment, a check of what it must have done, and whether it is
a server to start and stop. The copy's params.yaml (committed with the tiny settings below)
is reset from git before every command, as `git checkout params.yaml` in the README does.
A command without a row fails the test: adding a command to the README or to one of
those pages means adding its row here, so the docs cannot drift from what works.

Also here: docs/durations.md is what bench/durations_table.py writes from the committed
build records (bench/results/durations/) and the frozen legacy record
(bench/results/durations.yaml), and the README's durations are figures of those records.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from tests.conftest import ROOT, tiny_project

BIN = Path(sys.executable).parent
README = ROOT / "README.md"
# The pages whose commands run here, in the order they run: the README first, then the pages
# its commands moved to, in the order a reader following the README meets them (each
# command's check relies on what the commands before it built).
COMMAND_PAGES = ("README.md", "docs/running.md", "docs/profiles.md", "docs/controls.md", "docs/dvc.md",
                 "docs/nlg.md", "docs/own_loop.md")


def readme_commands(text: str | None = None, name: str = "README.md") -> list[str]:
    """The command lines of a page's fenced sh blocks (comment lines skipped)."""
    text = README.read_text(encoding="utf-8") if text is None else text
    commands = []
    for language, body in re.findall(r"^```(\S*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        assert language == "sh", f"{name}: every fenced block is a command block marked sh, got {language!r}"
        commands += [line.strip() for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return commands


def documented_commands() -> list[str]:
    """Every command of COMMAND_PAGES, in their order."""
    return [command for page in COMMAND_PAGES
            for command in readme_commands((ROOT / page).read_text(encoding="utf-8"), page)]


def test_the_parser_reads_sh_blocks_and_refuses_other_fences():
    text = "intro\n```sh\nmake quick\n# a comment\n\nmake test\n```\nmore\n```sh\ndvc repro\n```\n"
    assert readme_commands(text) == ["make quick", "make test", "dvc repro"]
    with pytest.raises(AssertionError, match="'python'"):
        readme_commands("```python\nprint(1)\n```\n")


# ---- the tiny settings -----------------------------------------------------------------

def tiny(params: dict) -> dict:
    """Table 1 with one model, two budgets and 3 epochs on both profiles (the paper profile
    on CPU with the quick data set: the test has no GPU and no internet), Tables 2/3 and
    the studies with one GPT-2 size, one alpha and one control on tiny synthetic data."""
    quick = params["profiles"]["quick"]
    quick["models"]["resnet18"] = {"width": 4, "epochs": 3, "milestones": [2], "warmup_epochs": 1}
    paper = params["profiles"]["paper"]
    paper.update(dataset=quick["dataset"], dataset_size=quick["dataset_size"], device="cpu", threads=1,
                 precision="fp32", compile=False,
                 eval_batch=256, eval_every=1, checkpoint_every=1, seeds=[0])
    paper["models"] = {"resnet18": dict(quick["models"]["resnet18"])}
    quick["table1"] = {"resnet18": [[1.0, 1.0], [0.5, 0.55]]}
    paper["table1"] = {"resnet18": [[1.0, 1.0], [0.5, 0.55]]}
    params["comparisons"] = {}
    nlg = quick["nlg"]
    nlg["data"] = {"n_train": 40, "n_dev": 4, "n_test": 6}
    nlg["pretrain"]["epochs"] = 1
    nlg["finetune"]["epochs"] = 1
    nlg["decoding"] = {"max_new_tokens": 16}
    for table in ("table2", "table3"):
        params[table].update(models=["gpt2-small"], alphas=[0.8])
    study = params["study"]
    study["seeds"] = [0]
    study["table1"].update(budgets={"quick": [[1.0, 1.0]], "paper": "table1"}, methods=["darel", "random"])
    study["table1"].pop("validation")  # the study's own controls: tests/test_workflow.py runs them
    study["table1"]["primary"]["methods"] = ["random"]
    for table in ("table2", "table3"):
        study[table].update(models=["gpt2-small"], alphas=[0.8], methods=["darel", "random"])
    return params


def _table(project: Path, name: str = "table1") -> pd.DataFrame:
    return pd.read_csv(project / f"results/{name}.csv")


def _check_quick(project, out):
    assert "== Done (quick profile) ==" in out
    assert "results/table1_vs_paper.md" in out and "make mlflow-ui" in out
    # The counts say what they count: the table's rows by method, the MLflow runs by kind.
    assert "results/table1.csv (3 rows: 1 baseline, 2 darel)" in out, out[-3000:]
    assert "table1 (3 cell runs of the quick profile + 1 with the table's files)" in out, out[-3000:]
    assert list(_table(project)["profile"].unique()) == ["quick"]
    assert (project / "mlflow.db").stat().st_size > 0
    # make quick recorded itself (issue 51): one new record, with Snakemake's jobs of this build.
    records = [json.loads(path.read_text()) for path in (project / "bench/results/durations").glob("*_quick_*.json")
               if not (ROOT / "bench/results/durations" / path.name).exists()]
    assert len(records) == 1, records
    assert {"download", "train_online", "table1"} <= {job["rule"] for job in records[0]["jobs"]}, records[0]["jobs"]
    assert records[0]["install_s"] is None  # the copy's environment was installed before this make


def _check_nothing_to_do(project, out):
    assert "Nothing to be done" in out, out[-3000:]


def _check_paper(project, out):
    assert list(_table(project)["profile"].unique()) == ["paper"]
    # Both profiles' cells coexist.
    for profile in ("quick", "paper"):
        assert (project / f"results/cells/{profile}/table1/resnet18/s0/baseline.json").exists(), profile


def _params_changed(project) -> bool:
    return subprocess.run(["git", "diff", "--quiet", "--", "params.yaml"], cwd=project).returncode != 0


def _check_exp_show(project, out):
    assert "profile" in out and "paper" in out, out[-3000:]
    # Not a terminal: nothing cut to "...", the experiment's headline figures on its line.
    assert "..." not in out and "…" not in out, out[-3000:]
    line = next(line for line in out.splitlines() if "[" in line and "paper" in line)
    assert "boost_mean" in out and "!" not in line, out[-3000:]
    assert _params_changed(project)  # `dvc exp run -S` left its value in the workspace


def _check_params_reset(project, out):
    assert not _params_changed(project)


def _check_override(project, out):
    cell = json.loads((project / "results/cells/quick/table1/resnet18/s0/baseline.json").read_text())
    assert cell["epochs"] == 6 and list(_table(project)["profile"].unique()) == ["quick"]


def _check_studies(project, out):
    rows = _table(project, "study_table1")
    assert sorted(set(rows["method"])) == ["baseline", "darel", "random"]
    for name in ("study_table2", "study_table3"):
        assert {"darel", "random"} <= set(_table(project, name)["method"]), name
    assert "Study (Table 1)" in out


def _check_table1(project, out):
    cell = json.loads((project / "results/cells/quick/table1/resnet18/s0/baseline.json").read_text())
    assert cell["epochs"] == 3 and list(_table(project)["profile"].unique()) == ["quick"]


def _check_metrics_show(project, out):
    # Table 1's file named: one short row, nothing failed to load; the count says what it counts.
    assert "failed" not in out.lower(), out[-3000:]
    lines = out.strip().splitlines()
    assert lines[0].split()[0] == "Path" and "boost_mean" in lines[0] and "darel_rows" in lines[0], out
    assert "rows" not in lines[0].replace("darel_rows", ""), out
    assert [line.split()[0] for line in lines[1:]] == ["results/table1_metrics.json"], out


def _check_plots_show(project, out):
    assert "dvc_plots/index.html" in out and "failed" not in out.lower(), out[-3000:]
    page = (project / "dvc_plots/index.html").read_text()
    assert re.search(r'<img src="[^"]*table1\.png"', page) and "<script" not in page, page[:2000]


def _check_nlg(project, out):
    for name in ("table2", "table3"):
        table = _table(project, name)
        assert list(table["model"].unique()) == ["gpt2-small"] and len(table) == 2, (name, table)


def _check_tables(project, out):
    assert "Table 2" in out and "Table 3" in out


def _check_score(project, out):
    scores = json.loads(out[out.index("{"):])
    assert set(scores) == {"BLEU", "NIST", "METEOR", "ROUGE_L", "CIDEr", "TER"}
    assert 0 <= scores["BLEU"] <= 1 and 0 <= scores["METEOR"] <= 1


def _check_example(project, out):
    assert re.search(r"^budget B\(0\.6, 0\.9\): batch \d+, alpha", out, flags=re.MULTILINE), out[-3000:]
    assert re.search(r"^darel: top-1 [0-9.]+ % in", out, flags=re.MULTILINE), out[-3000:]


def _check_mlflow_ui(project, port):
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=table1"
    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body = json.loads(resp.read())
            break
        except OSError:
            if time.time() > deadline:
                raise AssertionError("the MLflow UI did not answer within 180 s") from None
            time.sleep(1)
    tags = {t["key"]: t["value"] for t in body["experiment"].get("tags", [])}
    assert tags.get("mlflow.experimentKind") == "custom_model_development"
    # Table 1's saved view, which the address `make mlflow-ui` prints opens (tests_ui/ opens it in a browser),
    # listed by its name in the experiment's Views menu.
    view = json.loads(tags["mlflow.sharedViewState.darel-quick"])
    assert view["name"] == "Table 1 (quick profile, GENERATED data)"  # the tiny copy trains on generated data
    # The experiment's description, shown above its runs, says so first.
    assert tags["mlflow.note.content"].startswith(
        "Table 1 of the DAREL paper, reproduced: quick profile on GENERATED data, whose figures are not the paper's")
    assert "metrics.`boost paper`" in json.loads(view["state"])["selectedColumns"]


@dataclass
class Row:
    """How one README command runs here."""
    check: Callable | None = None  # check(project, output) after a successful run
    env: dict = field(default_factory=dict)
    server: bool = False  # a server: started, checked with check(project, port), stopped by its PID
    reset: bool = True  # start from the committed params.yaml (False: what the command before left)
    timeout: int = 3600  # only catches a hang: a busy machine may run these many times slower


COMMANDS: dict[str, Row] = {
    "make quick": Row(_check_quick),
    # The copy's own suite, narrowed to one file that does not read the tiny params.yaml:
    # the whole suite is what CI runs, and this test is part of it.
    "make test": Row(lambda project, out: None if " passed" in out else pytest.fail(out[-3000:]),
                     env={"PYTEST_ADDOPTS": "-p no:cacheprovider tests/test_selection.py"}),
    "source .venv/bin/activate": Row(),
    "snakemake results/table1.csv": Row(_check_nothing_to_do),
    "snakemake -n results/table1.csv": Row(_check_nothing_to_do),
    "make mlflow-ui": Row(_check_mlflow_ui, server=True),
    "snakemake results/table1.csv --config profile=paper": Row(_check_paper),
    "dvc exp run -S profile=paper table1": Row(_check_paper),
    "dvc exp show --md --drop '.*' --keep 'Experiment|profile$|.*_mean$|.*boost_max$'":
        Row(_check_exp_show, reset=False),
    "git checkout params.yaml": Row(_check_params_reset, reset=False),
    "snakemake results/table1.csv --config 'profiles={quick: {models: {resnet18: {epochs: 6, milestones: [2, 4]}}}}'":
        Row(_check_override),
    "make studies": Row(_check_studies),
    "dvc repro table1": Row(_check_table1),
    "dvc metrics show results/table1_metrics.json": Row(_check_metrics_show),
    "dvc plots show results/table1.png": Row(_check_plots_show),
    "dvc repro": Row(_check_nlg),
    "snakemake results/table2.csv results/table3.csv": Row(_check_nothing_to_do),
    "dvc repro table2 table3": Row(),
    "make tables": Row(_check_tables),
    "darel-nlg-metrics --refs data/nlg_quick/e2e/test_refs.txt --hyp runs/quick/table2/gpt2-small/s0/lora/hyps.txt":
        Row(_check_score),
    "python examples/own_training_loop.py --tiny": Row(_check_example),
}


def test_every_readme_command_has_a_row_and_every_row_a_command():
    first_block = re.search(r"^```sh\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    assert first_block and first_block.group(1) == "make quick\nmake test\n", \
        "the README's first block is exactly its two commands, make quick and make test"
    commands = documented_commands()
    missing = [c for c in commands if c not in COMMANDS]
    assert not missing, f"documented commands without a row in tests/test_readme.py COMMANDS: {missing}"
    stale = [c for c in COMMANDS if c not in commands]
    assert not stale, f"rows for commands neither the README nor COMMAND_PAGES has any more: {stale}"
    repeated = sorted({c for c in commands if commands.count(c) > 1})
    assert not repeated, f"commands written in two command blocks (one runs twice here): {repeated}"


def test_every_page_with_commands_is_linked_from_the_readme():
    links = set(re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8")))
    unlinked = [page for page in COMMAND_PAGES[1:] if page not in links]
    assert not unlinked, f"pages whose commands tests/test_readme.py runs but the README never links: {unlinked}"


def test_readme_links_only_the_projects_own_files():
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if not re.match(r"https?://", target):
            assert (ROOT / target.split("#")[0]).exists(), f"README links {target}, which is not in the project"
    assert not re.search(r"[`(]\.\./", text) and "shared/" not in text, "README points outside the project"


# ---- running them ----------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(extra: dict) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env['PATH']}"  # what `source .venv/bin/activate` does
    env["VIRTUAL_ENV"] = str(BIN.parent)
    env.pop("PYTEST_ADDOPTS", None)
    env.update(MLFLOW_DISABLE_TELEMETRY="true", PYTHONUNBUFFERED="1", **extra)
    return env


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    dest = tiny_project(tmp_path_factory.mktemp("readme"), tiny)
    # `make quick`'s install step, done: the copy's .venv is the environment running these
    # tests (each entry linked) with an install stamp newer than requirements.lock, so make
    # installs nothing.
    venv = dest / ".venv"
    venv.mkdir()
    for entry in BIN.parent.iterdir():
        if entry.name != ".installed":
            (venv / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (venv / ".installed").touch()
    return dest


@pytest.mark.slow
@pytest.mark.parametrize("command", documented_commands())
def test_readme_command(project, command):
    row = COMMANDS.get(command)
    assert row is not None, f"no row for README command {command!r}"
    if row.reset:
        subprocess.run(["git", "checkout", "-q", "--", "params.yaml"], cwd=project, check=True)
    if row.server:
        port = _free_port()
        proc = subprocess.Popen(["bash", "-c", command], cwd=project, env=_env({**row.env, "MLFLOW_PORT": str(port)}),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            row.check(project, port)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # the process group this test started, by its PID
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        return
    proc = subprocess.run(["bash", "-c", command], cwd=project, env=_env(row.env), capture_output=True, text=True,
                          timeout=row.timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command!r} failed ({proc.returncode}):\n{out[-6000:]}"
    if row.check:
        row.check(project, out)


# ---- durations: one record, one generated page ----------------------------------------

def _durations_module():
    spec = importlib.util.spec_from_file_location("durations_table", ROOT / "bench/durations_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_durations_page_is_the_generators_output():
    durations = _durations_module()
    page = (ROOT / "docs/durations.md").read_text(encoding="utf-8")
    assert page == durations.render(durations.load_record(), durations.load_builds(tracked_only=True)), \
        f"docs/durations.md is stale or edited by hand: run `{durations.COMMAND}` and commit the build records it reads"
    assert "GENERATED" in page.splitlines()[2] and durations.COMMAND in page


def test_every_recorded_duration_is_on_the_page_with_its_date_and_commit():
    durations = _durations_module()
    record = durations.load_record()
    rows, heading = set(), None
    page = (ROOT / "docs/durations.md").read_text(encoding="utf-8")
    legacy = page[page.index("## Before the records"):]  # the frozen legacy record's tables
    for line in legacy.splitlines():
        if line.startswith("### "):
            heading = line[4:]
        elif line.startswith("| ") and heading:
            rows.add((heading, *(cell.strip() for cell in line.strip("|").split(" | "))))
    for e in record["durations"]:
        minutes = str(e["minutes"])
        minutes = f"{minutes} (estimate)" if e.get("estimate") else f"about {minutes}" if e.get("approx") else minutes
        expected = (e["command"], e["load"], minutes, str(e["date"] or ""), str(e["commit"] or ""), e["machine"],
                    str(e["note"] or "").replace("|", "\\|"), e["source"])
        assert expected in rows, expected


def test_the_durations_record_refuses_an_incomplete_entry(tmp_path):
    durations = _durations_module()
    path = tmp_path / "durations.yaml"
    path.write_text("machines: {box: a box}\ndurations:\n- {command: make quick, load: idle, minutes: 3, machine: box}\n")
    with pytest.raises(ValueError, match=r"entry 1 \('make quick'\) lacks date, commit, note, source"):
        durations.load_record(path)
    path.write_text("machines: {box: a box}\ndurations:\n- {command: make quick, load: loaded, minutes: 3, date: null,"
                    " commit: null, machine: box, note: null, source: here}\n")
    with pytest.raises(ValueError, match=r"load 'loaded' is not one of"):
        durations.load_record(path)


def test_the_readmes_durations_are_figures_of_the_record():
    """Each row of the README's duration table is one idle measurement of that command in
    the record (rounded as the README writes it), and the README carries no date or hash."""
    durations = _durations_module()
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## How long it takes"):]
    section = section[:section.index("\n## ", 1)]
    rows = re.findall(r"^\| `([^`]+)`[^|]*\| (?:about )?([\d.]+) \|$", section, flags=re.MULTILINE)
    commands = re.findall(r"^\| `", section, flags=re.MULTILINE)
    assert len(rows) == len(commands) >= 4, f"every row of the table gives one figure in minutes:\n{section}"
    record = durations.load_record()["durations"]
    builds = durations.load_builds(tracked_only=True)
    for command, figure in rows:
        measured = [e["minutes"] for e in record if e["command"].startswith(command) and e["load"] == "idle"
                    and isinstance(e["minutes"], (int, float)) and not e.get("estimate")]
        measured += [b["wall_s"] / 60 for b in builds if b["command"] == command and b["load"]["verdict"] == "idle"]
        decimals = len(figure.partition(".")[2])
        assert any(round(m, decimals) == float(figure) for m in measured), (command, figure, measured)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "README.md: no dates (docs/durations.md has them)"
    assert not re.search(r"\b(?:commit|at) [0-9a-f]{7,40}\b", text), "README.md: no commit hashes"
