"""Where every artifact of the workflow lives, in one place.

The Snakemake rules build their paths here (with wildcard placeholders such as
``{model}``), the preflight checks list a table's intermediate files here, and the
readers name the rule that re-creates a damaged file from here. Every folder of a run
holds the profile, so the profiles' results live side by side:

    data/<profile>/                         the image data set (train.npz, test.npz, meta.json)
    data/nlg_<profile>/<dataset>/           a language data set (JSON Lines, references, meta.json)
    runs/<profile>/table1/<model>/s<seed>/<cell>/          one Table 1 training and its records
    runs/<profile>/study_table1/<model>/s<seed>/<cell>/<method>/   one control of the study
    runs/<profile>/nlg/<dataset>/...        tokenizer, pretrained models, the scorer's losses
    runs/<profile>/<table2|table3>/<model>/s<seed>/<cell>/  one LoRA fine-tuning
    results/cells/<profile>/<table>/...     the cell records the tables are built from
    results/<table>.csv, results/study_<table>.csv ...   the active profile's tables and studies
    logs/<profile>/...                      one log per job
    runs/.compile_cache/                    torch.compile's cache, shared by every profile's jobs

Every name that enters a path here has passed darel.grammar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from darel import grammar

RESULTS = "results"  # the tables, their cell records (results/cells) and studies
# torch.compile's on-disk cache (darel.runtime points jobs at it): under runs/, whose links the
# preflight checks; a dot name, which no profile can take (grammar.NAME).
COMPILE_CACHE = "runs/.compile_cache"
# Wildcard placeholders: a path helper called without a value keeps the wildcard.
MODEL, SEED, CELL, METHOD = "{model}", "{seed}", "{cell}", "{method}"
TABLE, NLG_MODEL, NLG_CELL, DATASET = "{table}", "{nlg_model}", "{nlg_cell}", "{dataset}"


def settings_name(cell: object) -> str:
    return "plan.json" if cell == grammar.IDS_ADONIS else "calibration.json"


def _join(*parts: object) -> str:
    return "/".join(str(part) for part in parts if part != "")


@dataclass(frozen=True)
class Layout:
    """The paths of one profile's artifacts."""

    profile: str

    def __post_init__(self) -> None:
        grammar.check_name(self.profile, "profile")

    @property
    def runs(self) -> str:
        """Every run of the profile (trainings, calibrations, subsets, records)."""
        return f"runs/{self.profile}"

    @property
    def cells(self) -> str:
        """The cell records of every table of the profile."""
        return f"{RESULTS}/cells/{self.profile}"

    # ---- image data ----------------------------------------------------------------
    @property
    def data(self) -> str:
        return f"data/{self.profile}"

    def data_file(self, name: str) -> str:
        return _join(self.data, name)

    # ---- Table 1 -------------------------------------------------------------------
    def table1(self, name: str = "", *, model: object = MODEL, seed: object = SEED, cell: object = CELL) -> str:
        """A Table 1 run's folder, or a file in it."""
        return _join(f"runs/{self.profile}/table1/{model}/s{seed}/{cell}", name)

    def table1_settings(self, *, model: object = MODEL, seed: object = SEED, cell: object = CELL) -> str:
        """A cell's run settings: a budget's calibration.json, the IDS + ADONIS row's
        plan.json (its fixed settings: no budget, nothing calibrated)."""
        return self.table1(settings_name(cell), model=model, seed=seed, cell=cell)

    def table1_cell(self, *, model: object = MODEL, seed: object = SEED, cell: object = CELL) -> str:
        return f"{RESULTS}/cells/{self.profile}/table1/{model}/s{seed}/{cell}.json"

    def table1_log(self, name: str, *, model: object = MODEL, seed: object = SEED, cell: object = CELL) -> str:
        return f"logs/{self.profile}/table1/{model}/s{seed}/{cell}/{name}"

    # ---- the Table 1 study ---------------------------------------------------------
    def study(self, name: str = "", *, model: object = MODEL, seed: object = SEED, cell: object = CELL,
              method: object = "") -> str:
        """A study cell's folder (shared by its methods), a method's folder, or a file."""
        return _join(f"runs/{self.profile}/study_table1/{model}/s{seed}/{cell}", method, name)

    def study_subset(self, subset: object = "{subset}", *, model: object = MODEL, seed: object = SEED,
                     cell: object = CELL) -> str:
        """A training set a study draws itself (e.g. random: random_subset.npz), shared by
        the cell's methods that train on it."""
        return self.study(f"{subset}_subset.npz", model=model, seed=seed, cell=cell)

    def study_cell(self, *, model: object = MODEL, seed: object = SEED, cell: object = CELL,
                   method: object = METHOD) -> str:
        return f"{RESULTS}/cells/{self.profile}/study_table1/{model}/s{seed}/{cell}/{method}.json"

    def baseline_fit(self, *, model: object = MODEL, seed: object = SEED) -> str:
        """A seed's baseline's fit on its own training set and its test curve's last quarter
        (stages/baseline_fit.py), for a study declared in the fitting regime."""
        return f"{RESULTS}/fit/{self.profile}/{model}/s{seed}.json"

    def study_log(self, name: str, *, model: object = MODEL, seed: object = SEED, cell: object = CELL,
                  method: object = "") -> str:
        return _join(f"logs/{self.profile}/study_table1/{model}/s{seed}/{cell}", method, name)

    # ---- Tables 2 and 3 ------------------------------------------------------------
    def nlg_data(self, name: str = "", *, dataset: object = DATASET) -> str:
        # beside, not inside, the DVC-tracked data/<profile>
        return _join(f"data/nlg_{self.profile}/{dataset}", name)

    def nlg_shared(self, name: str = "", *, dataset: object = DATASET) -> str:
        """Per data set: the tokenizer, the pretrained models, the scorer's losses."""
        return _join(f"runs/{self.profile}/nlg/{dataset}", name)

    def nlg_run(self, name: str = "", *, table: object = TABLE, model: object = NLG_MODEL, seed: object = SEED,
                cell: object = NLG_CELL) -> str:
        return _join(f"runs/{self.profile}/{table}/{model}/s{seed}/{cell}", name)

    def nlg_cell(self, *, table: object = TABLE, model: object = NLG_MODEL, seed: object = SEED,
                 cell: object = NLG_CELL) -> str:
        return f"{RESULTS}/cells/{self.profile}/{table}/{model}/s{seed}/{cell}.json"

    def nlg_log(self, name: str, *, table: object = TABLE, model: object = NLG_MODEL, seed: object = SEED,
                cell: object = NLG_CELL) -> str:
        return f"logs/{self.profile}/{table}/{model}/s{seed}/{cell}/{name}"

    def log(self, *parts: object) -> str:
        return _join(f"logs/{self.profile}", *parts)

    # ---- the tables and studies (the active profile's: one file each) ------------------
    @staticmethod
    def table_csv(table: object = TABLE) -> str:
        return f"{RESULTS}/{table}.csv"

    @staticmethod
    def table_outputs(table: object = TABLE, *, plot: bool = True) -> dict[str, str]:
        """A table's files: the rows, the comparison with the paper, the plot (Table 1),
        the headline metrics."""
        files = {"csv": f"{RESULTS}/{table}.csv", "compare": f"{RESULTS}/{table}_vs_paper.md"}
        if plot:
            files["plot"] = f"{RESULTS}/{table}.png"
        files["metrics"] = f"{RESULTS}/{table}_metrics.json"
        return files

    @staticmethod
    def data_card() -> str:
        """The report's page on the active profile's data (`make report`)."""
        return f"{RESULTS}/data_card.md"

    @staticmethod
    def study_outputs(study: object, *, composition: bool = False) -> dict[str, str]:
        """A study's files (``study``: study_table1, study_{nlg_table}): every row, the
        summary over seeds, the plot, the verdicts, the headline metrics; with
        ``composition`` (Table 1's study) also the plot of what each method trained on."""
        files = {"rows": f"{RESULTS}/{study}.csv", "summary": f"{RESULTS}/{study}_summary.csv",
                 "plot": f"{RESULTS}/{study}.png", "verdict": f"{RESULTS}/{study}.md",
                 "metrics": f"{RESULTS}/{study}_metrics.json"}
        if composition:
            files["composition"] = f"{RESULTS}/{study}_composition.png"
        return files


# ---- which rule writes a file ------------------------------------------------------------

_ANY = r"[^/]+"
# (pattern of the path, rule that writes it), first match wins.
_PRODUCERS = [
    (rf"data/nlg_{_ANY}/{_ANY}/[^/]+", "nlg_data"),
    (rf"data/{_ANY}/(train\.npz|test\.npz|meta\.json)", "download"),
    (rf"runs/{_ANY}/table1/{_ANY}/s[0-9]+/baseline/(model\.pt|train\.json|eval\.json)", "pretrain_scorer"),
    (rf"runs/{_ANY}/table1/{_ANY}/s[0-9]+/baseline/losses\.npz", "score_losses"),
    (rf"runs/{_ANY}/table1/{_ANY}/s[0-9]+/{grammar.IDS_ADONIS}/(subset\.npz|plan\.json)", "ids_subset"),
    (rf"runs/{_ANY}/table1/{_ANY}/s[0-9]+/{_ANY}/calibration\.json", "calibrate"),
    (rf"runs/{_ANY}/table1/{_ANY}/s[0-9]+/{_ANY}/subset\.npz", "materialise_subset"),
    (rf"runs/{_ANY}/table1/{_ANY}/s[0-9]+/{_ANY}/(model\.pt|train\.json|eval\.json)", "train_online"),
    (rf"runs/{_ANY}/table1/{_ANY}/s[0-9]+/{_ANY}/carbon\.json", "cell_record"),
    (rf"results/cells/{_ANY}/table1/.+\.json", "cell_record"),
    (rf"runs/{_ANY}/table1/{_ANY}/s[0-9]+/{_ANY}/mlflow\.json", "track_cell"),
    (rf"runs/{_ANY}/study_table1/{_ANY}/s[0-9]+/{_ANY}/[^/]+_subset\.npz", "study_subset"),
    (rf"runs/{_ANY}/study_table1/.+/(model\.pt|train\.json|plan\.json|eval\.json)", "study_train"),
    (rf"runs/{_ANY}/study_table1/.+/carbon\.json", "study_cell_record"),
    (rf"results/cells/{_ANY}/study_table1/.+\.json", "study_cell_record"),
    (rf"runs/{_ANY}/study_table1/.+/mlflow\.json", "study_track"),
    (rf"runs/{_ANY}/nlg/{_ANY}/tokenizer(/.*)?", "nlg_tokenizer"),
    (rf"runs/{_ANY}/nlg/{_ANY}/{_ANY}/pretrained(/.*)?", "nlg_pretrain"),
    (rf"runs/{_ANY}/nlg/{_ANY}/scorer_losses\.npz", "nlg_score"),
    (rf"runs/{_ANY}/table[23]/.+/adapter(/.*)?", "nlg_finetune"),
    (rf"runs/{_ANY}/table[23]/.+/(hyps\.txt|eval\.json)", "nlg_evaluate"),
    (rf"runs/{_ANY}/table[23]/.+/carbon\.json", "nlg_cell_record"),
    (rf"results/cells/{_ANY}/table[23]/.+\.json", "nlg_cell_record"),
    (rf"runs/{_ANY}/table[23]/.+/mlflow\.json", "nlg_track"),
]


def producer_rule(path: object) -> str | None:
    """The Snakemake rule that writes ``path`` (a path relative to the project), or None."""
    text = str(path).replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    for pattern, rule in _PRODUCERS:
        if re.fullmatch(pattern, text):
            return rule
    return None


def how_to_recreate(path: object, missing: bool = False) -> str:
    """One clause telling the user how a damaged, stale or missing file is made again."""
    rule = producer_rule(path)
    where = f"rule {rule} re-creates it" if rule else "the workflow re-creates it"
    return f"{'' if missing else 'delete it and '}run snakemake again ({where}, and what depends on it)"


# ---- what a path says a record is ----------------------------------------------------------------

_SEED_DIR = r"s(?P<seed>[0-9]+)"
# The places of records, first match wins (darel.provenance stamps and checks them).
_PLACES = [
    rf"data/nlg_(?P<profile>{_ANY})/(?P<dataset>{_ANY})/.+",
    rf"data/(?P<profile>{_ANY})/[^/]+",
    rf"runs/(?P<profile>{_ANY})/nlg/(?P<dataset>{_ANY})/(?P<model>{_ANY})/pretrained/.+",
    rf"runs/(?P<profile>{_ANY})/nlg/(?P<dataset>{_ANY})/.+",
    rf"runs/(?P<profile>{_ANY})/(?P<table>study_table1)/(?P<model>{_ANY})/{_SEED_DIR}/(?P<cell>{_ANY})/"
    rf"(?P<method>{_ANY})/[^/]+",
    rf"runs/(?P<profile>{_ANY})/(?P<table>{_ANY})/(?P<model>{_ANY})/{_SEED_DIR}/(?P<cell>{_ANY})/.+",
    rf"results/cells/(?P<profile>{_ANY})/(?P<table>study_table1)/(?P<model>{_ANY})/{_SEED_DIR}/(?P<cell>{_ANY})/"
    rf"(?P<method>{_ANY})\.json",
    rf"results/cells/(?P<profile>{_ANY})/(?P<table>{_ANY})/(?P<model>{_ANY})/{_SEED_DIR}/(?P<cell>{_ANY})\.json",
]


def cell_method(table: str, cell: str) -> str:
    """The method a table's cell id stands for: Table 1's baseline, IDS + ADONIS or DAREL
    (a budget); Tables 2/3's LoRA baseline, DAREL (an alpha) or a study control."""
    if table in ("table1", "study_table1"):
        return {grammar.TABLE1_BASELINE: "baseline", grammar.IDS_ADONIS: "ids+adonis"}.get(cell, "darel")
    for method, suffix in grammar.NLG_CONTROL_SUFFIX.items():
        if cell.endswith(suffix):
            return method
    return "lora" if cell == grammar.NLG_BASELINE else "darel"


def path_identity(path: object) -> dict | None:
    """What the place of a file says about the record in it (a path relative to the
    project): its profile, and where the layout has them its table, model, seed, cell,
    method and data set. None for a path outside the layout (a test's scratch file)."""
    text = str(path).replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    for pattern in _PLACES:
        match = re.fullmatch(pattern, text)
        if match:
            found = {key: value for key, value in match.groupdict().items() if value is not None}
            if "seed" in found:
                found["seed"] = int(found["seed"])
            if "cell" in found and "method" not in found and found["table"] != "study_table1":  # a study cell's
                # folder is shared by its methods
                found["method"] = cell_method(found["table"], found["cell"])
            return found
    return None


def marker_of(cell_record: object) -> str:
    """The MLflow marker (mlflow.json, the run id its tracking job sealed) of a cell record:
    results/cells/<profile>/<table>/.../<cell>[/<method>].json -> runs/<profile>/<table>/.../mlflow.json."""
    text = str(cell_record).replace("\\", "/")
    if not (text.startswith("results/cells/") and text.endswith(".json")):
        raise ValueError(f"{cell_record} is not a cell record of the layout (results/cells/...json)")
    return "runs/" + text[len("results/cells/"):-len(".json")] + "/mlflow.json"
