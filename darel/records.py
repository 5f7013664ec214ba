"""The cell record of every table: every number behind a row, from the records of the
stages that made it. One function per kind of table, pure (dicts in, a dict out); the
cell-record stage (stages/cell_record.py) reads, calls one of them and writes the sealed result.

* ``image_cell``: Table 1 and its study (the baseline, DAREL, IDS + ADONIS, a control);
  the method's plan comes from the training's own record (``method_plan`` in train.json:
  the method's typed plan, darel.methods), never from which files exist;
* ``nlg_cell``: Tables 2/3 and their studies (a LoRA fine-tuning and its scores).
"""

from __future__ import annotations

from darel import provenance
from darel.nlg.metrics import METRIC_KEYS, VARIANT_KEYS

# The MLflow experiments (and cell-record tables) of language cells: Tables 2/3 and their studies.
NLG_EXPERIMENTS = ("table2", "table3", "study_table2", "study_table3")


# The fields of a cell record that are measurements of time, energy or memory, or say how
# one was measured (clock, meter, energy source), or are made from one (a ratio to a
# measured time, a budget from the baseline's measured time and memory, a calibration's
# predictions). Two builds of a cell from the same inputs differ here and only here: every
# other field is a result, covered by the record's results_sha256 (darel.provenance). A
# Table 1 cell's settings (batch, alpha, A, eta, planned epochs) follow its calibration,
# itself timed by design: the same calibration gives the same results. Dotted names are
# fields of a sub-dict (the plan).
MEASUREMENTS = (
    "time_s", "wall_time_s", "time_total_s", "time_charged_s", "clock", "cores_beside",
    "peak_mem_bytes", "peak_mem_by_pass", "nvml_peak_bytes", "memory_source",
    "energy_kwh", "co2e_kg", "eq6_co2e_kg", "energy_duration_s", "energy_source", "energy_covers",
    "budget_adherence", "predicted_adherence", "T_full_s", "M_full_bytes", "T_new_s", "t_max_s", "m_max_bytes",
    "plan.predicted_time_s", "plan.predicted_adherence",
)


def sealed_results(cell: dict) -> dict:
    """A cell record with its results hash (``results_sha256`` over all but MEASUREMENTS)."""
    return provenance.seal_results(cell, MEASUREMENTS)


def is_nlg(table: str) -> bool:
    return table in NLG_EXPERIMENTS


def uses_scorer(train: dict, calibration: dict | None) -> bool:
    """Whether a cell's training set came from the offline scorer (its losses: DAREL's
    subset; its features: IDS)."""
    plan = train.get("method_plan") or {}
    if "uses_scorer" in plan:
        return bool(plan["uses_scorer"])
    if calibration is None:
        return False
    return calibration.get("method") == "ids+adonis" or plan.get("subset", "darel") == "darel"


def total_time(time_s: float, charged: dict[str, float]) -> dict:
    """The two accountings of a cell: ``time_s`` (the training, as the paper counts it) and
    ``time_total_s`` (plus what ``charged`` lists: the scorer's training, its scoring pass)."""
    return {"time_total_s": float(time_s) + float(sum(charged.values())), "time_charged_s": dict(charged)}


def image_cell(params: dict, train: dict, evaluation: dict, baseline: dict, calibration: dict | None,
               carbon: dict, scorer_costs: dict[str, float] | None = None) -> dict:
    """A Table 1 (or study) cell. ``params``: the report's slice (table, model, cell,
    method, profile, seed); ``train``, ``evaluation``: the cell's train.json and eval.json;
    ``baseline``: the model's baseline train.json (T and M); ``calibration``: the cell's
    calibration.json or IDS + ADONIS's plan.json (None for the baseline); ``carbon``: the
    carbon record of the training's energy; ``scorer_costs``: the scorer's costs
    (its training's time, its scoring or feature pass's), charged in ``time_total_s`` when
    the cell's training set came from the scorer."""
    is_baseline = calibration is None
    cal = calibration or {}
    plan = train.get("method_plan") or {}
    method = params.get("method") or ("baseline" if is_baseline else cal.get("method", "darel"))
    uses_alpha = plan.get("subset", "darel") != "full"
    online = plan.get("rule") is not None if plan else not is_baseline
    return sealed_results({
        "table": params["table"], "model": params["model"], "cell": params["cell"],
        "method": method,
        "profile": params["profile"], "seed": params["seed"], "dataset_label": train["dataset_label"],
        "t": cal.get("t"), "m": cal.get("m"),
        "batch": train["batch"],
        "alpha": cal["alpha"] if not is_baseline and uses_alpha else 1.0,
        "A": cal["A"] if not is_baseline and online else 1.0,
        "eta": cal["eta"] if not is_baseline and online and plan.get("rule") != "uniform" else None,
        "plan": plan or None,  # the method's whole typed plan (darel.methods), as its training recorded it
        "epochs": train["epochs_completed"], "epochs_planned": train["epochs_planned"],
        "epochs_protocol": train["epochs_protocol"], "enforce": train["enforce"],
        "stopped_by_budget": train["stopped_by_budget"],
        "time_s": train["time_s"], "wall_time_s": train.get("wall_time_s"), "clock": train.get("clock"),
        # other processes' busy cores beside the timed work (None: not measured, an older record)
        "cores_beside": train.get("cores_beside"),
        "top1": evaluation["top1"],
        # top-1 on the rare classes' test images and on the others' (None: the data names no rare class)
        "top1_rare": evaluation.get("top1_rare"), "top1_common": evaluation.get("top1_common"),
        # measured time / t_max: how closely the run kept its time budget (None without one)
        "budget_adherence": (train["time_s"] / cal["t_max_s"]) if cal.get("t_max_s") else None,
        "predicted_adherence": cal.get("predicted_adherence"),
        "peak_mem_bytes": train["peak_mem_bytes"], "peak_mem_by_pass": train["peak_mem_by_pass"],
        "memory_source": train["memory_source"], "nvml_peak_bytes": train.get("nvml_peak_bytes"),
        "precision": train["precision"], "score_batch": train["score_batch"],
        "energy_kwh": carbon.get("energy_kwh"), "co2e_kg": carbon.get("co2e_kg"),
        "eq6_co2e_kg": carbon.get("eq6_co2e_kg"), "energy_source": carbon.get("energy_source"),
        "energy_covers": carbon.get("energy_covers"), "energy_duration_s": carbon.get("duration_s"),
        "T_full_s": baseline["time_s"], "M_full_bytes": baseline["peak_mem_bytes"],
        "T_new_s": cal.get("T_new_s"), "t_max_s": cal.get("t_max_s"), "m_max_bytes": cal.get("m_max_bytes"),
        "n_train": train["n_train"], "n_train_full": train["n_train_full"],
        "samples_trained": train["samples_trained"], "device": train["device"],
        "n_params": train.get("n_params"), "macs_per_image": train.get("macs_per_image"),
        "input_shape": train.get("input_shape"),
        "planned_samples": plan.get("planned_samples"),
        # trained sample-steps by the data's per-sample groups, beside the data's shares
        "composition": train.get("composition"),
        **total_time(train["time_s"], (scorer_costs or {}) if uses_scorer(train, calibration) else {}),
    })


def nlg_cell(params: dict, train: dict, scores: dict, dataset_label: str, carbon: dict,
             scorer_costs: dict[str, float] | None = None) -> dict:
    """A Table 2/3 (or study) cell: ``train`` is the adapter's train.json, ``scores`` the
    metric suite's eval.json; ``scorer_costs`` (the scorer's scoring pass) are charged in
    ``time_total_s`` when the pairs were ranked by it (DAREL's and the easy control's)."""
    return sealed_results({**total_time(train["time_s"], scorer_costs or {}),"table": params["table"], "model": params["model"], "cell": params["cell"],
            "method": params.get("method") or ("lora" if params["alpha"] is None else "darel"),
            "alpha": params["alpha"],
            "profile": params["profile"], "seed": params["seed"], "dataset_label": dataset_label,
            **{k: scores[k] for k in METRIC_KEYS},
            # absent when eval.json came from the scorer without --variants
            **{k: scores.get(k) for k in VARIANT_KEYS},
            "time_s": train["time_s"], "wall_time_s": train.get("wall_time_s"), "clock": train.get("clock"),
            "peak_mem_bytes": train["peak_mem_bytes"],
            "memory_source": train["memory_source"], "energy_kwh": carbon.get("energy_kwh"),
            "co2e_kg": carbon.get("co2e_kg"), "eq6_co2e_kg": carbon.get("eq6_co2e_kg"),
            "energy_source": carbon.get("energy_source"), "energy_covers": carbon.get("energy_covers"),
            "n_train": train["n_train"],
            "n_train_full": train["n_train_full"], "n_test": scores["n_test"],
            "n_outputs_cut": scores.get("n_outputs_cut"), "device": train["device"]})


# ---- a cell record against the records it summarises ----------------------------------------

# Each figure a table shows straight from one of a cell's sources: cell field -> (source, field).
# A record the cell copied its figures from cannot have changed since (the table stages
# check this before a row is made: a cell record made from other figures is refused).
IMAGE_FIGURES = {
    "time_s": ("train", "time_s"), "peak_mem_bytes": ("train", "peak_mem_bytes"),
    "epochs": ("train", "epochs_completed"), "samples_trained": ("train", "samples_trained"),
    "n_train": ("train", "n_train"), "batch": ("train", "batch"), "top1": ("eval", "top1"),
    "top1_rare": ("eval", "top1_rare"), "top1_common": ("eval", "top1_common"),
    "T_full_s": ("baseline_train", "time_s"), "M_full_bytes": ("baseline_train", "peak_mem_bytes"),
    "t_max_s": ("calibration", "t_max_s"), "energy_kwh": ("carbon", "energy_kwh"), "co2e_kg": ("carbon", "co2e_kg"),
}
NLG_FIGURES = {
    "time_s": ("train", "time_s"), "peak_mem_bytes": ("train", "peak_mem_bytes"), "n_train": ("train", "n_train"),
    **{key: ("eval", key) for key in METRIC_KEYS}, "n_test": ("eval", "n_test"),
    "energy_kwh": ("carbon", "energy_kwh"), "co2e_kg": ("carbon", "co2e_kg"),
}


def figure_disagreements(cell: dict, sources: dict[str, dict]) -> list[str]:
    """The figures of ``cell`` that differ from the source records they were copied from
    (``sources``: name -> record as read; a source the cell was made without is absent)."""
    figures = NLG_FIGURES if is_nlg(cell.get("table", "")) else IMAGE_FIGURES
    out = []
    for field, (source, key) in figures.items():
        if source not in sources or field not in cell:
            continue
        if cell[field] != sources[source].get(key):
            out.append(f"{field} {cell[field]!r} but {source} {key} {sources[source].get(key)!r}")
    return out
