"""``darel-nlg-metrics`` beside the official E2E scorer, on the same files and machine.

The official scorer (e2e-metrics: ``measure_scores.py``, ``mteval-v13a-sig.pl`` and the
MS-COCO caption code) is not part of this repository and is not on PyPI: give the folder
of a checkout of it with ``--official``. Its Python needs (future, matplotlib,
scikit-image) are installed into a throwaway virtual environment under /tmp on first
use (``--venv``); its Perl needs XML::Twig (Debian: libxml-twig-perl) and Java. A
checkout whose large files are missing (the two jars, METEOR's paraphrase table) can
borrow them from the installed pycocoevalcap package: ``--borrow-jars``.

Input: an E2E CSV with references (default: the development set, 547 inputs with 8.5
references each on average), given with ``--csv``. Per input, the last reference with
every sixth word dropped is the output and the other references are the references
(7.5 on average); the files are written to ``--work``. Both scorers run ``--rounds``
times, alternating, each as a fresh process; the report gives every wall time and the
medians, and checks that the two agree on BLEU, NIST, METEOR, ROUGE_L and CIDEr (the
official scorer prints 4 decimals).

Usage: python bench/nlg_metrics.py --official /tmp/e2e-metrics --csv /tmp/devset.csv
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from darel.io import write_json  # noqa: E402
from darel.nlg.readers import read_e2e_csv  # noqa: E402

KEYS = ("BLEU", "NIST", "METEOR", "ROUGE_L", "CIDEr")


def make_inputs(csv_path: Path, work: Path) -> tuple[Path, Path, dict]:
    examples = read_e2e_csv(csv_path)
    hyps, blocks = [], []
    for example in examples:
        refs = list(example.references)
        output = refs.pop() if len(refs) > 1 else refs[0]
        hyps.append(" ".join(w for i, w in enumerate(output.split()) if i % 6 != 5))
        blocks.append("\n".join(refs))
    work.mkdir(parents=True, exist_ok=True)
    refs_file, hyp_file = work / "refs.txt", work / "hyp.txt"
    refs_file.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    hyp_file.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    counts = [len(b.split("\n")) for b in blocks]
    return refs_file, hyp_file, {"inputs": len(hyps), "references_mean": sum(counts) / len(counts),
                                 "references_max": max(counts)}


def official_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "future", "matplotlib", "scikit-image"],
                       check=True)
    return python


def borrow_jars(official: Path) -> None:
    import pycocoevalcap

    source = Path(pycocoevalcap.__file__).parent
    for rel in ("meteor/meteor-1.5.jar", "meteor/data/paraphrase-en.gz", "tokenizer/stanford-corenlp-3.4.1.jar"):
        target = official / "pycocoevalcap" / rel
        if not target.exists() or target.stat().st_size == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / rel, target)


def run_timed(cmd: list[str], cwd: Path | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--official", required=True, help="folder of an e2e-metrics checkout (measure_scores.py)")
    ap.add_argument("--csv", required=True, help="an E2E CSV with references, e.g. devset.csv")
    ap.add_argument("--venv", default="/tmp/darel-e2e-metrics-venv", help="throwaway venv for the official scorer")
    ap.add_argument("--borrow-jars", action="store_true",
                    help="copy missing jars / paraphrase table from the installed pycocoevalcap")
    ap.add_argument("--work", default="/tmp/darel-bench-nlg-metrics")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    official = Path(args.official).resolve()
    if not (official / "measure_scores.py").is_file():
        raise SystemExit(f"{official}: no measure_scores.py (not an e2e-metrics checkout)")
    if args.borrow_jars:
        borrow_jars(official)
    refs, hyp, shape = make_inputs(Path(args.csv), Path(args.work))
    python = official_venv(Path(args.venv))
    ours_cmd = [sys.executable, "-m", "darel.nlg.metrics_cli", "--refs", str(refs), "--hyp", str(hyp),
                "--no-progress"]
    theirs_cmd = [str(python), "measure_scores.py", str(refs), str(hyp)]
    env_note = {"cpus": os.cpu_count(), "load_average_before": os.getloadavg()}
    times = {"darel-nlg-metrics": [], "official": []}
    for _ in range(args.rounds):
        elapsed, out = run_timed(theirs_cmd, cwd=official)
        times["official"].append(elapsed)
        official_scores = {k: float(v) for k, v in re.findall(r"^(\w+): ([0-9.]+)$", out, re.M)}
        elapsed, out = run_timed(ours_cmd)
        times["darel-nlg-metrics"].append(elapsed)
        ours = json.loads(out)
    agree = {k: round(ours[k], 4) == official_scores[k] for k in KEYS}
    stats = {**shape, **env_note, "wall_s": times,
             "median_s": {name: statistics.median(v) for name, v in times.items()},
             "official": official_scores, "ours": ours, "agree_to_4_decimals": agree}
    print(json.dumps(stats, indent=2))
    if args.out:
        write_json(args.out, stats)


if __name__ == "__main__":
    main()
