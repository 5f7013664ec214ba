"""The figures the study pages quote come from the committed study rows: recomputed here
with the study's own functions, so an edited or stale page fails; and the index's headline
is each regime's headline study's verdict (issue 28: the headline is the declared primary analysis;
issue 51: one page per study under docs/studies/, docs/studies.md their index)."""

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pandas as pd
import pytest
import yaml

from darel import study

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "docs/studies.md"
PAGES = ROOT / "docs/studies"
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())["study"]
# Each study page that quotes a primary analysis: the page, its rows as built, the primary
# analysis it was declared with before its runs (each page's "Declaration"), its methods and
# seeds. The fifth study's is the committed params.yaml's at the time of its runs.
STUDIES_QUOTED = {
    "seventh (underfitting headline)": (PAGES / "underfit_stages2.md", PAGES / "underfit_stages2_2026-11-29_rows.csv",
                                        {"metric": "top1", "methods": ["random"], "margin": 3.0},
                                        ["darel", "random", "uniform-online", "random-offline", "darel-floor",
                                         "darel-restream", "oracle-clean"], 24),
    "sixth (not trustworthy)": (PAGES / "underfit_stages.md", PAGES / "underfit_stages_2026-11-29_rows.csv",
                                {"metric": "top1", "methods": ["random"], "margin": 3.0},
                                ["darel", "random", "uniform-online", "random-offline", "darel-floor",
                                 "darel-restream", "oracle-clean"], 12),
    "fit regime (fitting headline)": (PAGES / "fit_regime.md", PAGES / "fit_regime_2026-11-29_rows.csv",
                              {"metric": "top1", "methods": ["random"], "margin": 3.0},
                              ["darel", "random", "uniform-online", "random-offline", "darel-floor",
                               "darel-history", "darel-bins", "darel-restream", "oracle-clean"], 12),
    "fifth": (PAGES / "synth_study5.md", PAGES / "synth_study5_2026-11-28_rows.csv",
                         {"metric": "top1", "methods": ["random"], "margin": 3.0},
                         ["darel", "random", "darel-restream", "oracle-clean"], 12),
    "fourth": (PAGES / "synth_study4.md", PAGES / "synth_study4_2026-11-28_rows.csv",
               {"metric": "top1", "methods": ["random"], "margin": 3.0},
               ["darel", "random", "darel-restream", "oracle-clean"], 11),
    "third": (PAGES / "synth_study3.md", PAGES / "synth_study3_2026-11-28_rows.csv",
              {"metric": "top1", "methods": ["random"], "margin": 3.0},
              ["darel", "random", "darel-restream", "oracle-clean"], 11),
    "second": (PAGES / "synth_study2.md", PAGES / "synth_study_2026-11-28_rows.csv",
               {"metric": "top1", "methods": ["random", "short-schedule"], "margin": 3.0},
               ["darel", "random", "short-schedule", "darel-restream", "oracle-clean"], 16),
    "first": (PAGES / "synth_study1.md", PAGES / "synth_study_2026-11-27_rows.csv",
              {"metric": "top1", "methods": ["random", "short-schedule"], "margin": 3.0},
              ["darel", "random", "short-schedule", "darel-restream", "oracle-clean"], 20),
}


def _section(page: Path, heading: str) -> str:
    """From the heading that begins with `heading` to the next heading of its level or above."""
    text = page.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _budgets(rows: pd.DataFrame) -> int:
    """How many study budgets the rows hold (the baseline is not one)."""
    return rows.loc[rows["method"] != "baseline", "budget"].nunique()


def _results(page: Path) -> str:
    return _section(page, "## Results")


def _table(section: str, header_start: str) -> list[list[str]]:
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("*") for cell in line.strip("|").split("|")])  # bold marks a missed MDD
    return rows


def _short_budget(budget: str) -> str:  # "B(t=0.80, m=0.80)" -> "B(0.8, 0.8)", as the docs write it
    t, m = re.fullmatch(r"B\(t=([\d.]+), m=([\d.]+)\)", budget).groups()
    return f"B({float(t):g}, {float(m):g})"


def _short_budget_or_none(budget) -> str | None:
    return _short_budget(budget) if isinstance(budget, str) and budget.startswith("B(") else None


@pytest.mark.parametrize("which", list(STUDIES_QUOTED))
def test_a_quoted_primary_analysis_is_recomputed_from_its_rows(which):
    page, path, primary, _, n_seeds = STUDIES_QUOTED[which]
    rows = pd.read_csv(path)
    family = rows[rows["method"].isin([study.REFERENCE, *primary["methods"]])]
    diffs = study.paired_differences(family, primary["metric"], margin=primary["margin"], level=PARAMS["level"])
    quoted = {(r[0], r[1]): r for r in _table(_results(page), "| budget | DAREL minus |")}
    assert len(quoted) == len(diffs) == _budgets(rows) * len(primary["methods"]) >= 2
    for row in diffs.to_dict("records"):
        line = quoted[(_short_budget(row["budget"]), row["control"])]
        assert float(line[2]) == pytest.approx(row["mean_diff"], abs=0.006)
        low, high = (float(x) for x in line[3].strip("[]").split(","))
        assert (low, high) == pytest.approx((row["ci95_low"], row["ci95_high"]), abs=0.006)
        assert float(line[4]) == pytest.approx(row["p_holm"], rel=0.05)
        assert float(line[5]) == pytest.approx(row["mdd"], abs=0.006)
        assert line[6] == f"{row['wins']}/{row['n']}" and row["n"] == n_seeds
    # Each section says whether power met the declared margin at every comparison.
    met = (diffs["mdd"] <= primary["margin"]).all()
    assert bool(re.search(r"\*\*Power[^*\n]*: not met", _results(page))) == (not met)


@pytest.mark.parametrize("which", list(STUDIES_QUOTED))
def test_a_quoted_top1_table_matches_its_rows(which):
    page, path, _, methods, n_seeds = STUDIES_QUOTED[which]
    rows = pd.read_csv(path)
    table = _table(_results(page), "| budget | darel | random |")
    assert len(table) == _budgets(rows) >= 2
    for line in table:
        assert len(line) == 1 + len(methods)
        for method, cell in zip(methods, line[1:]):
            mean, sd = (float(x) for x in cell.split("±"))
            top1 = rows[(rows["method"] == method) & (rows["budget"].map(_short_budget_or_none) == line[0])]["top1"]
            assert len(top1) == n_seeds
            assert (mean, sd) == pytest.approx((top1.mean(), top1.std(ddof=1)), abs=0.006)


# Each regime's headline study: its page, its verdict file, and the words that mark its part of the headline.
HEADLINES = {"underfitting": ("underfit_stages2.md", "underfit_stages2_2026-11-29_verdicts.md", "* **Underfitting regime**"),
             "fitting": ("fit_regime.md", "fit_regime_2026-11-29_verdicts.md", "* **Fitting regime**")}


def _headline_parts() -> dict[str, str]:
    """The index's headline split into its regimes' bullets (the text after them: the last one's)."""
    headline = _section(INDEX, "## Headline")
    underfitting, fitting = headline.split(HEADLINES["fitting"][2])
    return {"underfitting": underfitting[underfitting.index(HEADLINES["underfitting"][2]):], "fitting": fitting}


@pytest.mark.parametrize("regime", list(HEADLINES))
def test_the_headline_says_the_study_is_not_trustworthy_when_its_verdict_file_does(regime):
    page_name, verdicts_name, _ = HEADLINES[regime]
    verdicts = (PAGES / verdicts_name).read_text()
    page = _results(PAGES / page_name)
    trusted = "not trustworthy" not in verdicts
    assert trusted == ("not trustworthy" not in page.split("\n\n")[1])
    part = _headline_parts()[regime].split("\n\n")[0]  # the bullet itself, not the paragraph after it
    assert f"studies/{page_name}" in part and trusted == ("not trustworthy" not in part)


def test_the_index_headline_quotes_each_regimes_primary_differences():
    """The index's headline of each regime quotes its study's DAREL minus random at each
    budget as the study page's table does: the seventh study where the network underfits
    (and the fifth, which it repeats at the paper's gamma), the fit-regime study where it fits."""
    parts = _headline_parts()
    underfitting, fitting = parts["underfitting"], parts["fitting"].split("\n\n")[0]
    for page, text, budgets in ((PAGES / "underfit_stages2.md", underfitting, 2), (PAGES / "synth_study5.md", underfitting, 3),
                                (PAGES / "fit_regime.md", fitting, 2)):
        table = _table(_results(page), "| budget | DAREL minus |")
        assert len(table) == budgets
        for line in table:
            assert line[2] in text and line[0] in text
        assert f"studies/{page.name}" in text
    assert "underfit" not in fitting and "GENERATED" in fitting and "GENERATED" in underfitting


README_PRIMARY = {"metric": "top1", "methods": ["random"], "margin": 3.0}  # both studies' declared before their runs


def _readme_table_checked(section: str, rows_csv: str, budgets: int):
    """Each line of the first "DAREL minus random" table in ``section`` with its row recomputed
    from the study's committed rows and its 95 % interval, after checking the difference,
    interval and MDD it quotes."""
    rows = pd.read_csv(ROOT / rows_csv)
    family = rows[rows["method"].isin([study.REFERENCE, *README_PRIMARY["methods"]])]
    diffs = study.paired_differences(family, README_PRIMARY["metric"], margin=README_PRIMARY["margin"],
                                     level=PARAMS["level"])
    quoted = {line[0]: line for line in _table(section, "| budget | DAREL minus random")}
    assert len(quoted) == len(diffs) == budgets
    for row in diffs.to_dict("records"):
        line = quoted[_short_budget(row["budget"])]
        assert float(line[1]) == pytest.approx(row["mean_diff"], abs=0.006)
        low, high = (float(x) for x in line[2].strip("[]").split(","))
        assert (low, high) == pytest.approx((row["ci95_low"], row["ci95_high"]), abs=0.006)
        assert float(line[3]) == pytest.approx(row["mdd"], abs=0.006)
        yield line, row, low, high


def test_the_readmes_result_at_a_glance_is_the_headline_studys_primary_analysis():
    """README.md's two tables of DAREL minus random (difference, 95 % interval, MDD, verdict),
    the underfitting regime's (the seventh study) and the fitting regime's (the fit-regime
    study), are recomputed from each study's committed rows with its declared primary
    analysis; the section says GENERATED and the regime."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Results at a glance"):]
    section = section[:section.index("\n## ", 1)]
    margin = README_PRIMARY["margin"]
    for line, row, low, high in _readme_table_checked(section, "docs/studies/underfit_stages2_2026-11-29_rows.csv", 2):
        # "worse" only where the whole interval lies beyond the margin and the MDD is met.
        assert line[4] == "DAREL worse" and high < -margin and row["mdd"] <= margin
    assert "GENERATED" in section and "underfitting regime" in section
    assert "docs/studies/underfit_stages2.md" in section[:section.index("**A second regime**")]
    regime = section[section.index("**A second regime**"):]
    assert "docs/studies/fit_regime.md" in regime
    for line, row, low, high in _readme_table_checked(regime, "docs/studies/fit_regime_2026-11-29_rows.csv", 2):
        # "equivalent" only where the whole interval lies within the margin and the MDD is met.
        assert line[4] == "equivalent within ±3" and -margin < low and high < margin and row["mdd"] <= margin


STAGE_PAGES = {"fit regime": (PAGES / "fit_regime.md", PAGES / "fit_regime_2026-11-29_rows.csv"),
               "seventh": (PAGES / "underfit_stages2.md", PAGES / "underfit_stages2_2026-11-29_rows.csv"),
               "sixth": (PAGES / "underfit_stages.md", PAGES / "underfit_stages_2026-11-29_rows.csv")}


def test_a_study_that_failed_a_control_says_so_first_and_claims_nothing():
    """The sixth study's verdict file says it is not trustworthy (its positive control
    failed); its page says so as the first line of its results and gives no verdict."""
    verdicts = (PAGES / "underfit_stages_2026-11-29_verdicts.md").read_text()
    assert "**This study is not trustworthy**" in verdicts
    results = _results(PAGES / "underfit_stages.md")
    assert "not trustworthy" in results.split("\n\n")[1]
    assert _section(PAGES / "underfit_stages.md", "## Verdict").splitlines()[2].startswith("None:")


@pytest.mark.parametrize("which", list(STAGE_PAGES))
def test_a_quoted_stage_share_is_the_verdict_files_stage_comparison(which):
    """A page's table of each stage's share (offline only, online only: method minus random in
    top-1) is what the study stage's own ``stage_comparisons`` computes from the rows (issue 50
    item 3: tested, not narrated)."""
    page, path = STAGE_PAGES[which]
    rows = pd.read_csv(path)
    found = study.stage_comparisons(rows, study.stage_methods(list(rows["method"].unique())), "top1",
                                    margin=README_PRIMARY["margin"], level=PARAMS["level"])
    found = found[found["figure"] == "top1"]
    quoted = {(line[0].split(":")[1].split(" minus ")[0].strip(), line[1]): line
              for line in _table(_section(page, "### Each stage's share"), "| comparison | budget |")}
    assert len(quoted) == len(found) == 2 * _budgets(rows)
    for row in found.to_dict("records"):
        line = quoted[(row["variant"], _short_budget(row["budget"]))]
        assert line[0].startswith({"offline": "offline only", "online": "online only"}[row["stage"]])
        assert float(line[2]) == pytest.approx(row["mean_diff"], abs=0.006)
        low, high = (float(x) for x in line[3].strip("[]").split(","))
        assert (low, high) == pytest.approx((row["ci95_low"], row["ci95_high"]), abs=0.006)
        assert float(line[4]) == pytest.approx(row["p_holm"], rel=0.05, abs=0.00005)  # 0.0006 for 0.00056
        assert float(line[5]) == pytest.approx(row["mdd"], abs=0.006)
        assert line[6] == f"{row['wins']}/{row['n']}"


def _stage_range(rows_csv: str, variant: str, figure: str) -> str:
    """A stage's cost over the budgets as the docs write it, "2.5-2.8 pp": the smallest and
    largest |method minus random| in ``figure`` from the study's own ``stage_comparisons``."""
    rows = pd.read_csv(ROOT / rows_csv)
    found = study.stage_comparisons(rows, study.stage_methods(list(rows["method"].unique())), "top1",
                                    margin=README_PRIMARY["margin"], level=PARAMS["level"])
    costs = sorted(-found[(found["variant"] == variant) & (found["figure"] == figure)]["mean_diff"])
    assert len(costs) == 2 and costs[0] > 0  # two budgets, each a cost
    def one_decimal(x: float) -> str:  # as written by hand: 6.85 (6.8499999 in binary) is 6.9
        return str(Decimal(f"{x:.6f}").quantize(Decimal("0.1"), ROUND_HALF_UP))

    return f"{one_decimal(costs[0])}-{one_decimal(costs[-1])} pp"


def test_the_mechanism_sentences_cite_the_stage_comparisons():
    """Issue 50 item 3: a sentence of the README or the index's headline on what each stage
    costs quotes the stage comparisons the study stage computes from the committed rows."""
    underfit = "docs/studies/underfit_stages2_2026-11-29_rows.csv"
    readme = (ROOT / "README.md").read_text()
    readme = readme[readme.index("## Results at a glance"):]
    readme_underfit, readme_fit = readme.split("**A second regime**", 1)
    parts = _headline_parts()
    def flat(text: str) -> str:  # a quote may break across lines
        return " ".join(text.split())

    for text in map(flat, (readme_underfit, parts["underfitting"])):
        assert f"the loss-ranked subset {_stage_range(underfit, 'uniform-online', 'top1')}" in text
        assert f"histogram keeping {_stage_range(underfit, 'random-offline', 'top1')}" in text
    fit = _stage_range("docs/studies/fit_regime_2026-11-29_rows.csv", "random-offline", "top1_rare")
    for text in map(flat, (readme_fit, parts["fitting"])):
        assert f"{fit[:-3]} pp" in text


def test_the_seventh_pages_composition_table_is_the_rows_mean():
    """Each group's share of the trained sample-steps that the seventh study's page quotes is
    the mean over its seeds of the rows' ``trained_share_<group>``, and the data's line the
    rows' ``data_share_<group>``."""
    rows = pd.read_csv(PAGES / "underfit_stages2_2026-11-29_rows.csv")
    rows = rows[rows["method"] != "baseline"]
    groups = ["rare-class", "label-noise", "hard", "near-duplicate"]
    table = _table(_results(PAGES / "underfit_stages2.md"), "| budget | method | rare classes (%) |")
    assert len(table) == rows.groupby(["budget", "method"]).ngroups + 1
    for line in table:
        if line[0] == "(the data)":
            shares, column = rows, "data_share"
        else:
            shares, column = rows[(rows["budget"].map(_short_budget) == line[0]) & (rows["method"] == line[1])], "trained_share"
            assert shares["seed"].nunique() == 24
        for group, cell in zip(groups, line[2:]):
            assert float(cell) == pytest.approx(100 * shares[f"{column}_{group}"].mean(), abs=0.006)
