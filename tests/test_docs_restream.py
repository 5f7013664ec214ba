"""The restream study's page (issue 50 item 5) quotes its committed rows: its control table,
the per-run top-1, the exploratory pairs and the index's sentences are recomputed here with
the study's own functions, so an edited or stale figure fails."""

import itertools
from pathlib import Path

import pandas as pd
import pytest
import yaml

from darel import study
from tests.test_docs_headline import _table  # cells without their bold marks

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/studies/restream.md"
ROWS = ROOT / "docs/studies/restream_2026-11-29_rows.csv"
VERDICTS = ROOT / "docs/studies/restream_2026-11-29_verdicts.md"
LEVEL = yaml.safe_load((ROOT / "params.yaml").read_text())["study"]["level"]
# As declared (restream_declaration.md): DAREL and three restreams, 85 seeds, one budget.
RUNS = ["darel-restream", "darel-restream-2", "darel-restream-3"]
VALIDATION = {"negative": RUNS[0], "negative_runs": RUNS}
SEEDS = list(range(500, 585))


@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return pd.read_csv(ROWS)


@pytest.fixture(scope="module")
def checks(rows) -> pd.DataFrame:
    return study.validation_checks(rows, "top1", VALIDATION, level=LEVEL).set_index("check")


def _section(heading: str) -> str:
    text = PAGE.read_text()
    start = text.index(heading)
    end = text.find("\n#", start + 1)
    return text[start:end]


def _interval(cell: str) -> tuple[float, float]:
    low, high = (float(x) for x in cell.strip("[]").split(","))
    return low, high


def test_the_rows_are_the_declared_design(rows):
    assert sorted(rows["method"].unique()) == sorted(["baseline", "darel", *RUNS])
    for method, group in rows.groupby("method"):
        assert sorted(group["seed"]) == SEEDS, method
    assert set(rows.loc[rows["method"] != "baseline", "cell"]) == {"t0.80_m0.80"}


def test_the_control_table_is_recomputed_from_the_rows(checks):
    table = _table(_section("## Results"), "| comparison | compared |")
    assert [line[0] for line in table] == ["(a) negative control", "(b) chance reference"]
    for line, check in zip(table, (study.NEGATIVE, study.NEGATIVE_REFERENCE)):
        row = checks.loc[check]
        assert row["n"] == len(SEEDS)
        assert float(line[2]) == pytest.approx(row["mean_diff"], abs=0.006)
        assert _interval(line[3]) == pytest.approx((row["ci95_low"], row["ci95_high"]), abs=0.006)
        assert float(line[4]) == pytest.approx(row["p_holm"], abs=0.006)
        assert float(line[5]) == pytest.approx(row["std_diff"], abs=0.006)
        assert float(line[6]) == pytest.approx(row["mdd"], abs=0.006)
        assert line[7] == ("yes" if row["passed"] else "no") if row["judged"] else line[7] == "not judged"


def test_the_verdict_file_reads_the_control_as_the_page_does(checks):
    """The page's reading is the verdict file's (written by the study stage), and that file
    holds the same comparisons as the recomputation."""
    verdicts = VERDICTS.read_text()
    reading = study.restream_reading(checks.reset_index(), level=LEVEL)
    assert reading and reading[0] in verdicts
    assert "no systematic difference" in reading[0]
    # No positive control was declared: the file and the page's verdict both say "not validated".
    assert "**This study is not validated**" in verdicts
    assert "not validated" in _section("## Verdict")
    assert "no systematic difference: DAREL's stream behaves as one more restream" in " ".join(PAGE.read_text().split())
    own = checks.loc[study.NEGATIVE]
    assert f"| {own['mean_diff']:+.4g} | [{own['ci95_low']:+.4g}, {own['ci95_high']:+.4g}] |" in verdicts


def test_the_per_run_top1_is_the_rows_mean(rows):
    section = _section("## Results")
    table = _table(section, "| darel | darel-restream |")
    assert len(table) == 1
    for method, cell in zip(["darel", *RUNS], table[0]):
        mean, sd = (float(x) for x in cell.split("±"))
        top1 = rows.loc[rows["method"] == method, "top1"]
        assert (mean, sd) == pytest.approx((top1.mean(), top1.std(ddof=1)), abs=0.006)
    baseline = rows.loc[rows["method"] == "baseline", "top1"]
    assert f"the baseline {baseline.mean():.2f} ± {baseline.std(ddof=1):.2f}" in section


def test_the_exploratory_pairs_are_paired_tests_over_the_rows(rows):
    wide = rows.pivot_table(index="seed", columns="method", values="top1")
    table = _table(_section("### Each stream apart"), "| compared | difference")
    pairs = list(itertools.combinations(["darel", *RUNS], 2))
    assert [line[0] for line in table] == [f"{a} minus {b}" for a, b in pairs]
    for line, (a, b) in zip(table, pairs):
        test = study.paired_test(list(wide[a] - wide[b]))
        assert float(line[1]) == pytest.approx(test["mean_diff"], abs=0.006)
        assert _interval(line[2]) == pytest.approx((test["ci95_low"], test["ci95_high"]), abs=0.006)
        assert float(line[3]) == pytest.approx(test["p_value"], abs=0.006)
        assert float(line[4]) == pytest.approx(test["std_diff"], abs=0.006)
        mdd = study.min_detectable_difference(test["std_diff"], test["n"], LEVEL, 0.8)  # unadjusted, as the page says
        assert float(line[5]) == pytest.approx(mdd, abs=0.006)
        assert test["p_value"] >= LEVEL  # the page says none is significant before any adjustment


def test_the_index_quotes_the_judged_comparison(checks):
    own = checks.loc[study.NEGATIVE]
    quote = (f"{own['mean_diff']:+.2f} pp, 95 % interval [{own['ci95_low']:+.2f}, {own['ci95_high']:+.2f}], "
             f"MDD {own['mdd']:.2f}")
    index = " ".join((ROOT / "docs/studies.md").read_text().split())
    verdict = " ".join(_section("## Verdict").split())
    assert quote in index
    assert quote.replace(" pp,", " pp top-1,") + " pp" in verdict


def test_the_readme_quotes_the_judged_comparison(checks):
    own = checks.loc[study.NEGATIVE]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"({own['mean_diff']:+.2f} pp, MDD {own['mdd']:.2f}; [its page](docs/studies/restream.md))" in readme
