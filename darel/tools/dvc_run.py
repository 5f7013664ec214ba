"""Stage "dvc run": what a DVC stage executes, Snakemake on the stage's targets.

Inside `dvc exp run -S KEY=VALUE` (DVC sets DVC_EXP_NAME) a failed run must not leave the
repository broken: DVC writes the experiment's value into params.yaml and leaves it there
when the experiment fails, so every later `snakemake` would fail on it. This stage then
keeps the experiment's file as params.failed-<experiment>.yaml and puts params.yaml back
to the last commit, saying so. Outside experiments it only runs Snakemake.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", help="Snakemake targets")
    args = ap.parse_args()
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
    code = subprocess.run([snakemake, "--cores", "all", *args.targets], check=False).returncode
    experiment = os.environ.get("DVC_EXP_NAME")
    if code != 0 and experiment:
        print(f"dvc exp run: experiment {experiment} failed (snakemake exit code {code}); {restore_params(experiment)}",
              file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
