"""darel.stagekit: one writer per folder, and no stage outliving its workflow."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")

# A stand-in for a stage: the stage start-up's orphan guard, then work until stopped.
STAGE = textwrap.dedent("""
    import logging, sys, time
    sys.path.insert(0, {root!r})
    from darel import stagekit
    logging.basicConfig(level=logging.INFO, handlers=[logging.FileHandler({log!r})],
                        format="%(levelname)s %(message)s")
    stagekit.stop_with_parent(logging.getLogger("stage"), interval_s=0.2)
    open({ready!r}, "w").write("ready")
    while True:
        time.sleep(0.05)
""")

# A stand-in for Snakemake (the guard recognises it by its script name): it starts the
# stage through a shell that stays in between (the stage's parent is the shell, not it).
WORKFLOW = textwrap.dedent("""
    import subprocess, sys, time
    stage = subprocess.Popen(["bash", "-c", sys.argv[1] + "; echo after"])
    open(sys.argv[2], "w").write(str(stage.pid))
    time.sleep(3600)
""")


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def _wait(condition, timeout_s: float = 300.0) -> bool:
    deadline = time.monotonic() + timeout_s  # generous: a busy machine
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _stage_script(tmp_path: Path) -> Path:
    script = tmp_path / "stage.py"
    script.write_text(STAGE.format(root=str(ROOT), log=str(tmp_path / "stage.log"), ready=str(tmp_path / "ready")))
    return script


def _stage_pid(tmp_path: Path) -> int:
    """The stand-in stage's PID (the python under the shell), once its guard is set up."""
    assert _wait(lambda: (tmp_path / "ready").exists()), "the stage did not start"
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(cmdline) > 1 and cmdline[1] == str(tmp_path / "stage.py").encode():
                return int(entry.name)
    raise AssertionError("stage process not found")


def _kill_and_watch_the_stage(tmp_path, ancestor: subprocess.Popen) -> str:
    """SIGKILL ``ancestor`` once the stage it started is running, check that the stage then
    stops by itself, and return the stage's log."""
    try:
        stage = _stage_pid(tmp_path)
    finally:
        os.kill(ancestor.pid, signal.SIGKILL)
        ancestor.wait(timeout=60)
    assert _wait(lambda: _gone(stage)), "the stage runs on as an orphan"
    return (tmp_path / "stage.log").read_text()


def test_a_stage_under_a_shell_stops_when_snakemake_dies(tmp_path):
    """The watchdog path: the shell between Snakemake and the stage survives Snakemake's
    SIGKILL, so no parent-death signal reaches the stage; it notices and stops itself."""
    workflow = tmp_path / "snakemake"
    workflow.write_text(WORKFLOW)
    command = f"{sys.executable} {_stage_script(tmp_path)}"
    snake = subprocess.Popen([sys.executable, str(workflow), command, str(tmp_path / "shell.pid")])
    log = _kill_and_watch_the_stage(tmp_path, snake)
    assert "the workflow that started this stage has ended" in log and "stopping" in log


def test_a_stage_stops_with_its_parent(tmp_path):
    """The parent-death signal: the stage's direct parent is killed."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, {str(_stage_script(tmp_path))!r}]); "
                               "time.sleep(3600)"])
    assert "stopping" in _kill_and_watch_the_stage(tmp_path, parent)


def test_a_second_writer_of_a_folder_is_refused_with_the_holders_pid(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import logging, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from darel import stagekit
        stagekit.claim_folder({str(tmp_path / "run")!r}, "pretrain", logging.getLogger("x"))
        open({str(tmp_path / "ready")!r}, "w").write("ready")
        time.sleep(3600)
    """)])
    try:
        assert _wait(lambda: (tmp_path / "ready").exists())
        second = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            import logging, sys
            sys.path.insert(0, {str(ROOT)!r})
            from darel import stagekit
            stagekit.claim_folder({str(tmp_path / "run")!r}, "pretrain", logging.getLogger("x"))
        """)], capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        assert f"PID {holder.pid}" in second.stderr and str(tmp_path / "run") in second.stderr
    finally:
        holder.kill()
        holder.wait(timeout=60)
    # The lock dies with its holder (kill -9 included): the next writer gets the folder.
    again = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import logging, sys
        sys.path.insert(0, {str(ROOT)!r})
        from darel import stagekit
        stagekit.claim_folder({str(tmp_path / "run")!r}, "pretrain", logging.getLogger("x"))
    """)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
