"""Stage "table": gathers the cell JSONs of Table 1 into results/table1.csv, writes the
side-by-side comparison with the paper (Markdown) and the boost vs accuracy-drop plot."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

try:
    import darel  # noqa: F401
except ImportError:  # run as a script from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from darel import io  # noqa: E402
from darel.plots import plot_table1  # noqa: E402
from darel.table import build_table1, compare_with_paper, load_paper_table1, round_for_csv  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cells", nargs="+", required=True, help="cell JSON files, baselines included")
    ap.add_argument("--out", required=True, help="Table 1 as CSV")
    ap.add_argument("--compare", help="Markdown comparison with the paper's Table 1")
    ap.add_argument("--plot", help="PNG: boost vs accuracy drop per model")
    ap.add_argument("--log", help="log file (overwritten); stderr always gets the log too")
    args = ap.parse_args(argv)

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if args.log:
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(args.log, mode="w", encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("darel.stage.table")

    cells = [io.read_json(path) for path in args.cells]
    table = build_table1(cells)
    io.write_text(args.out, round_for_csv(table).to_csv(index=False))
    log.info("Table 1: %d rows from %d cells -> %s", len(table), len(cells), args.out)
    paper, baselines = load_paper_table1()
    if args.compare:
        io.write_text(args.compare, compare_with_paper(table, paper, baselines))
        log.info("comparison with the paper -> %s", args.compare)
    if args.plot:
        plot_table1(table, args.plot, paper=paper)
        log.info("plot -> %s", args.plot)


if __name__ == "__main__":
    main()
