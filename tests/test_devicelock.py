"""Device turns (darel.devicelock): one process at a time holds a GPU's lock, from its first
use of the device to its exit, and a stage does its whole start-up before it waits.

The lock never needs a GPU: it is taken for a device type, and "cuda" is only a string here.
No test asserts a duration: a waiting process is seen waiting, not timed."""

import json
import os
import select
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from darel import config, data, devicelock, runtime
from darel.stagekit import models as stage_models
from darel.stagekit import training as stage_training
from tests.conftest import ROOT, TINY_SYNTH

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock and /proc are Linux's")

# A process that takes the turn for a CUDA device, says so, and holds it until its stdin closes.
HOLDER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    from darel import devicelock
    waited = devicelock.take_turn("cuda", {env!r})
    print(json.dumps({{"waited": waited, "again": devicelock.take_turn("cuda", {env!r})}}), flush=True)
    sys.stdin.read()
""")


def _env(tmp_path, **extra):
    return {devicelock.LOCK_DIR_ENV: str(tmp_path / "locks"), **extra}


def _holder(tmp_path, env):
    return subprocess.Popen([sys.executable, "-c", HOLDER.format(root=str(ROOT), env=env)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def test_turns_apply_to_a_cuda_device_of_a_workflow_that_asks_and_to_process_zero_only(tmp_path):
    env = _env(tmp_path)
    assert devicelock.turns_on("cuda", env)
    assert not devicelock.turns_on("cpu", env)
    assert not devicelock.turns_on("cuda", {})
    assert not devicelock.turns_on("cuda", {**env, "LOCAL_RANK": "1"})
    assert devicelock.turns_on("cuda", {**env, "LOCAL_RANK": "0"})
    assert devicelock.take_turn("cpu", env) is None and not (tmp_path / "locks").exists()


def test_jobs_share_a_lock_exactly_when_they_see_the_same_gpus_of_the_same_allocation(tmp_path):
    def path(**env):
        return devicelock.lock_path(tmp_path, env)

    assert path() == path()
    assert path(CUDA_VISIBLE_DEVICES="0") != path(CUDA_VISIBLE_DEVICES="1")
    assert path(SLURM_JOB_ID="11", CUDA_VISIBLE_DEVICES="0") != path(SLURM_JOB_ID="12", CUDA_VISIBLE_DEVICES="0")
    assert path(SLURM_JOB_ID="11") == path(SLURM_JOB_ID="11")
    odd = path(CUDA_VISIBLE_DEVICES="GPU-1/../x y")
    assert odd.parent == tmp_path and "/" not in odd.name and " " not in odd.name


def _said(proc, timeout_s: float = 600.0) -> dict:
    """The holder's line once it holds the turn (generous: a busy machine)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, "the process never got its turn"
    return json.loads(proc.stdout.readline())


def test_a_second_process_waits_for_the_first_and_a_killed_holder_frees_the_gpu(tmp_path):
    env = _env(tmp_path)
    lock = devicelock.lock_path(env[devicelock.LOCK_DIR_ENV], env)
    procs = []
    try:
        procs.append(first := _holder(tmp_path, env))
        said = _said(first)
        assert said["waited"] >= 0 and said["again"] == 0.0  # a second call in the same process: no wait
        assert devicelock.is_held(lock)
        procs.append(second := _holder(tmp_path, env))
        # The second one cannot get the turn while the first lives: it is still waiting here
        # (a slow machine only makes it later).
        time.sleep(1.0)
        assert second.poll() is None and not select.select([second.stdout], [], [], 0)[0]
        first.kill()  # the operating system frees a dead holder's lock
        first.wait(timeout=600)
        assert _said(second)["waited"] > 0
        assert devicelock.is_held(lock)
        second.stdin.close()
        assert second.wait(timeout=600) == 0
        assert not devicelock.is_held(lock)
        # A process that sees other GPUs takes its own turn while this lock is held.
        procs.append(third := _holder(tmp_path, env))
        _said(third)
        procs.append(fourth := _holder(tmp_path, _env(tmp_path, CUDA_VISIBLE_DEVICES="1")))
        _said(fourth)
        for proc in (third, fourth):
            proc.stdin.close()
            assert proc.wait(timeout=600) == 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=600)


# A turn taken in a fresh process (a hang would be a FIFO opened for reading): what it says.
TAKER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from darel import devicelock, io
    try:
        devicelock.take_turn("cuda", {env!r})
    except io.OutputError as err:
        print(type(err).__name__, err)
    else:
        print("taken")
""")


def _take(env) -> str:
    return subprocess.run([sys.executable, "-c", TAKER.format(root=str(ROOT), env=env)], capture_output=True,
                          text=True, timeout=600, check=True).stdout.strip()


@pytest.mark.parametrize("plant", ["link", "dangling", "fifo", "hardlink", "folder-link", "owner", "notes"])
def test_a_turns_lock_is_never_opened_through_a_link_a_fifo_or_anothers_file(tmp_path, plant):
    """The reporter's case: the lock as a link made the turn truncate its target and write a
    PID in it; a FIFO there was a traceback. Each is now one line naming it, nothing written."""
    if plant == "owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    env = _env(tmp_path)
    lock = devicelock.lock_path(env[devicelock.LOCK_DIR_ENV], env)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("the victim's content\n")
    lock.parent.mkdir(parents=True)
    if plant == "link":
        lock.symlink_to(victim)
    elif plant == "dangling":
        lock.symlink_to(outside / "created")
    elif plant == "fifo":
        os.mkfifo(lock)
    elif plant == "hardlink":
        os.link(victim, lock)
    elif plant == "folder-link":
        lock.parent.rmdir()
        lock.parent.symlink_to(outside)
    elif plant == "owner":
        lock.write_text("123\n")
        os.chown(lock, os.geteuid() + 4321, -1)
    else:
        lock.write_text("someone's notes\nline two\n")
    said = _take(env)
    expected = {"link": f"LinkError {lock} is a link", "dangling": f"LinkError {lock} is a link",
                "fifo": f"OutputError {lock} is not a plain file",
                "hardlink": f"OutputError {lock} is a file with 2 hard links",
                "folder-link": f"LinkError {lock.parent} is a link (to {outside})",
                "owner": f"OutputError {lock} belongs to another user",
                "notes": f"OutputError {lock} holds something other than a lock record"}[plant]
    assert said.startswith(expected) and "\n" not in said, said
    assert victim.read_text() == "the victim's content\n"
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    if plant in ("owner", "notes"):
        assert lock.read_text() in ("123\n", "someone's notes\nline two\n")


def test_a_turns_lock_left_by_an_earlier_job_is_reused(tmp_path):
    env = _env(tmp_path)
    lock = devicelock.lock_path(env[devicelock.LOCK_DIR_ENV], env)
    lock.parent.mkdir(parents=True)
    lock.write_text("4242\n")  # the PID a finished job left
    assert _take(env) == "taken" and lock.read_text().strip().isdigit() and lock.read_text() != "4242\n"


def test_configure_runtime_takes_the_turn_unless_the_stage_takes_it_later(monkeypatch):
    calls = []
    monkeypatch.setattr(devicelock, "take_turn", lambda device_type: calls.append(device_type) or 0.0)
    assert runtime.configure_runtime(torch.device("cpu"), 1) == 0.0
    assert runtime.configure_runtime(torch.device("cpu"), 1, take_turn=False) is None
    assert calls == ["cpu"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("turns")
    cfg = config.load_params(ROOT / "params.yaml", {
        "datasets": {"synth": {"sizes": {"cpu": dict(TINY_SYNTH)}}},
        "profiles": {"quick": {"models": {"resnet18": {"width": 4, "epochs": 2, "milestones": [1],
                                                        "warmup_epochs": 0}}}}})
    train, test, meta = data.make_synth_dataset(config.dataset_params(cfg))
    data.write_dataset(root / "data", train, test, meta)
    return {"root": root, "params": config.training_params(cfg, "resnet18", 0)}


def _record(monkeypatch, events):
    def wrap(module, name, event):
        original = getattr(module, name)

        def recorded(*args, **kwargs):
            events.append(event)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)

    wrap(stage_models, "read_dataset", "read")
    wrap(stage_models, "to_tensors", "device")
    wrap(stage_training.TrainingRun, "follow", "mlflow")
    wrap(stage_training.TrainingRun, "energy", "energy")
    monkeypatch.setattr(devicelock, "take_turn", lambda device_type: events.append("turn") or 0.0)


@pytest.mark.parametrize("turns", [True, False])
def test_a_training_starts_its_mlflow_run_energy_tracker_and_reads_its_data_before_its_turn(tiny, monkeypatch,
                                                                                           turns):
    """The turn comes after the start-up a job can do beside another job's work (reading and
    checking the data set, the live MLflow run, with turns the energy tracker) and before
    anything goes onto the device. Without turns the tracker starts after the data's
    placement, next to the first epoch, as it always did."""
    import logging

    events = []
    _record(monkeypatch, events)
    monkeypatch.setattr(devicelock, "turns_on", lambda device_type, environ=None: turns)
    summary = stage_training.run_training(tiny["params"], data_dir=str(tiny["root"] / "data"),
                                          out_dir=str(tiny["root"] / "cell"), log=logging.getLogger("t"),
                                          progress=False)
    assert summary["epochs_completed"] == 2
    assert events.count("turn") == 1
    assert events.index("read") < events.index("mlflow") < events.index("turn") < events.index("device")
    assert (events.index("energy") < events.index("turn")) == turns
    assert (events.index("energy") < events.index("device")) == turns


# Whether torch's compiler is loaded when the turn is taken, with turns on (a lock folder)
# and off, in a fresh process: a test process may have loaded it long before.
COMPILER_AT_TURN = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    from darel import devicelock, runtime
    before = "torch._dynamo" in sys.modules
    at_turn = []
    devicelock.take_turn = lambda device_type: at_turn.append("torch._dynamo" in sys.modules) or 0.0
    runtime.take_device_turn("cuda")
    print(json.dumps({{"before": before, "at_turn": at_turn[0]}}), flush=True)
""")


@pytest.mark.parametrize("turns", [True, False])
def test_a_job_imports_the_compiler_before_its_turn_only_when_turns_are_on(tmp_path, turns):
    """The first optimizer imports torch._dynamo (seconds on a GPU host): with turns on, a
    job pays that before the wait, not while it holds the GPU; without turns nothing changes."""
    env = {k: v for k, v in os.environ.items() if k != devicelock.LOCK_DIR_ENV}
    if turns:
        env[devicelock.LOCK_DIR_ENV] = str(tmp_path / "locks")
    out = subprocess.run([sys.executable, "-c", COMPILER_AT_TURN.format(root=str(ROOT))], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"before": False, "at_turn": turns}


def test_a_scoring_or_evaluation_stage_reads_its_data_before_its_turn(tiny, monkeypatch):
    events = []
    _record(monkeypatch, events)
    device, split = stage_models.device_and_split(tiny["params"], tiny["root"] / "data")
    assert device.type == "cpu" and len(split["train_y"]) == TINY_SYNTH["n_train"]
    assert events == ["read", "turn", "device", "device"]


def test_the_gpu_turns_bench_reads_the_wait_and_the_start_from_a_stage_log(tiny, monkeypatch, caplog):
    """bench/gpu_turns.py reads back what the stages log: the wait (from the turn line that
    place_split writes) and the start before it; for a log without turns, the start up to the
    data set's placement plus the live MLflow run."""
    import logging

    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_turns

    monkeypatch.setattr(devicelock, "take_turn", lambda device_type: 2.5)
    fmt = logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    with caplog.at_level(logging.INFO):
        stage_models.device_and_split(tiny["params"], tiny["root"] / "data")
    turn = next(fmt.format(r) for r in caplog.records if "for its turn" in r.getMessage())
    log = "\n".join(["2026-11-27 07:00:00,000 stage INFO params {}",
                     "2026-11-27 07:00:00,000 stage INFO evaluate: 4.00 s since the process started (imports)",
                     "2026-11-27 07:00:03,000 " + turn.split(" ", 2)[2]])
    found = gpu_turns.before_device(log)
    assert found["wait_s"] == 2.5 and abs(found["start_s"] - 4.5) < 1e-9
    old = "\n".join(["2026-11-27 07:00:00,000 stage INFO params {}",
                     "2026-11-27 07:00:00,000 stage INFO train: 4.00 s since the process started (imports)",
                     "2026-11-27 07:00:01,000 models INFO data set on cuda: 5 + 5 images in 0.5 s",
                     "2026-11-27 07:00:01,500 stage INFO run plan: RunPlan()",
                     "2026-11-27 07:00:08,000 stage INFO MLflow run abc (experiment table1, k): per-epoch metrics"])
    assert gpu_turns.before_device(old) == {"start_s": 11.5, "wait_s": None}
