"""Stage "dvc run": what a DVC stage executes, Snakemake on the stage's targets.

Inside `dvc exp run -S KEY=VALUE` (DVC sets DVC_EXP_NAME) a failed run must not leave the
repository broken: DVC writes the experiment's value into params.yaml and leaves it there
when the experiment fails, so every later `snakemake` would fail on it. This stage then
keeps the experiment's file as params.failed-<experiment>.yaml and puts params.yaml back
to the last commit, saying so. Outside experiments it only runs Snakemake.

Outside the project's environment (`dvc repro` with the system's `python` first on PATH) no
Snakemake is found: the stage stops with one line saying how to enter it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

PARAMS = Path("params.yaml")


def restore_params(experiment: str) -> str:
    """Keep the failed experiment's params.yaml aside and restore the committed one;
    return what was done, in one sentence."""
    kept = PARAMS.with_name(f"params.failed-{experiment}.yaml")
    committed = subprocess.run(["git", "show", f"HEAD:{PARAMS}"], capture_output=True, text=True, check=False)
    if committed.returncode != 0:
        return f"params.yaml left as it is (no committed version to restore: {committed.stderr.strip()})"
    if PARAMS.read_text(encoding="utf-8") == committed.stdout:
        return "params.yaml is unchanged"
    shutil.copy2(PARAMS, kept)
    PARAMS.write_text(committed.stdout, encoding="utf-8")
    return (f"the experiment's params.yaml is kept as {kept} and params.yaml is back at the last commit, so "
            f"snakemake and dvc repro work again (compare: git diff --no-index params.yaml {kept})")


OUTSIDE_ENVIRONMENT = "run `source .venv/bin/activate` (or `make dvc-repro`) first"


def find_snakemake() -> str | None:
    """The Snakemake of this Python's environment, else the one on PATH; None outside any."""
    beside = Path(sys.executable).with_name("snakemake")
    return str(beside) if beside.is_file() else shutil.which("snakemake")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", help="Snakemake targets")
    args = ap.parse_args()
    snakemake = find_snakemake()
    if snakemake is None:
        sys.exit(f"dvc_run: {sys.executable} is not the project's environment (no snakemake beside it or on "
                 f"PATH): {OUTSIDE_ENVIRONMENT}")
    code = subprocess.run([snakemake, "--cores", "all", *args.targets], check=False).returncode
    experiment = os.environ.get("DVC_EXP_NAME")
    if code != 0 and experiment:
        print(f"dvc exp run: experiment {experiment} failed (snakemake exit code {code}); {restore_params(experiment)}",
              file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
