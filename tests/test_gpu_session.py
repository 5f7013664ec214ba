"""bench/gpu_session.sh on the CPU (issue 52 item 6): the prepared GPU session runs each part
under its time box, records every outcome (ok, failed, timed out, skipped, unknown) in its
summary, packs the Table 1 run and goes on after a part fails. The benches and Snakemake are
replaced by a stand-in interpreter (``PYTHON``), so what is tested is the session's own logic;
the benches themselves have their CPU tests (test_gpu_bench.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSION = ROOT / "bench" / "gpu_session.sh"


def _stand_in(tmp_path: Path) -> Path:
    """A ``PYTHON`` that answers for the benches and Snakemake and hands everything else
    (the summary's version line, the packing) to the real interpreter."""
    path = tmp_path / "python-stand-in"
    path.write_text(f"""#!/bin/bash
case "$*" in
  *"import sys, torch"*) echo "python (stand-in) | torch (stand-in)"; exit 0 ;;  # the summary's header: no torch
  *bench/gpu.py*) echo "stand-in gpu bench: $*"; exec sleep "${{STAND_IN_GPU_S:-0}}" ;;
  *bench/nlg.py*) echo "stand-in nlg bench"; exit 3 ;;
  "-m snakemake"*) echo "stand-in snakemake: $(printf '[%s]' "$@")"; mkdir -p results logs; echo "row,top1" > results/table1.csv
                   echo "a stage log" > logs/stage.log; exit 0 ;;
esac
exec {sys.executable} "$@"
""")
    path.chmod(0o755)
    return path


def _session(tmp_path: Path, *parts: str, **env: str) -> tuple[str, Path]:
    out = tmp_path / "out"
    full_env = {**os.environ, "PYTHON": str(_stand_in(tmp_path)), "OUT": str(out), "KIT_DIR": str(tmp_path / "no-kit"),
                "CORES": "2", **env}
    work = tmp_path / "work"  # the session's folder: what table1 writes and packs stays here
    work.mkdir(exist_ok=True)
    done = subprocess.run(["bash", str(SESSION), *parts], cwd=work, env=full_env, capture_output=True, text=True,
                          timeout=1800)  # generous: a busy machine
    assert done.returncode == 0, done.stderr
    return (out / "summary.md").read_text(), out


def test_every_part_is_recorded_and_a_failed_part_does_not_stop_the_session(tmp_path):
    summary, out = _session(tmp_path, "kit", "table1", "graphs", "gpu", "nlg", "bogus")
    assert "| kit | failed (exit 2) |" in summary  # no kit carried: said so, and the session goes on
    assert "run 'make gpu-kit'" in (out / "kit.log").read_text()
    assert "| table1 | ok |" in summary and "| graphs | ok |" in summary and "| gpu | ok |" in summary
    assert "| nlg | failed (exit 3) |" in summary
    assert "| bogus | unknown part (kit, startup, warmup, table1, graphs, gpu, nlg) |" in summary
    assert "profile config: profile=gpu" in summary and "row,top1" in summary  # the default profile; its table
    # The bench gets its default arguments and writes its JSON into the session's output.
    assert f"--device cuda --models resnet18 --out {out}/gpu_bench.json" in (out / "gpu_bench.txt").read_text()
    with tarfile.open(out / "table1_run.tar.gz") as packed:
        names = set(packed.getnames())
    assert {"results/table1.csv", "logs/stage.log", "table1_snakemake.log"} <= names
    # graphs: the same build with the profile's step under CUDA graphs, the override one argument.
    with tarfile.open(out / "table1_graphs_run.tar.gz") as packed:
        assert {"results/table1.csv", "table1_graphs_snakemake.log"} <= set(packed.getnames())
        graphs_log = packed.extractfile("table1_graphs_snakemake.log").read().decode()
    assert "[--config][profile=gpu][profiles={gpu: {compile: graphs}}]" in graphs_log


def test_a_part_past_its_box_is_cut_and_the_next_is_skipped_when_the_budget_is_spent(tmp_path):
    # gpu's box 30 s (the least a part is started with) against a 100 s bench; the 75 s budget
    # less its 20 s reserve then leaves nlg under 30 s: skipped, not started. (Nothing before gpu
    # imports torch, so a slow machine still starts it with more than 30 s left.)
    summary, _ = _session(tmp_path, "gpu", "nlg", GPU_S="30", STAND_IN_GPU_S="100", GPU_SESSION_BUDGET_S="75")
    assert "| gpu | timed out after 30 s |" in summary
    assert "| nlg | skipped: " in summary and "s left in the budget" in summary
    assert int(summary.split("session: ")[1].split(" s of 75 s")[0]) >= 30
