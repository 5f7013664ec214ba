"""Stage "carbon report": joins a cell's training, evaluation and calibration records
into the cell JSON (every number of its table row, recomputable) and adds the Eq. 6
cross-check of CO2e from the measured average powers. The MLflow run is completed by its
own job afterwards (stages/track.py), so a tracking failure never costs this JSON."""

from __future__ import annotations

from pathlib import Path

from darel import checkpoint, provenance, stagekit
from darel.layout import how_to_recreate
from darel.measure import carbon_record


def build_cell(params: dict, train: dict, evaluation: dict, baseline: dict, calibration: dict | None,
               carbon: dict, plan: dict | None = None) -> dict:
    is_baseline = calibration is None
    cal = calibration or {}
    if plan is None and cal.get("planned_epochs") is not None:  # a DAREL cell: its plan is the calibration's
        plan = {"subset": "darel", "rule": "histogram", **{k: cal[k] for k in (
            "planned_epochs", "predicted_time_s", "predicted_adherence", "plan_exceeds_budget") if k in cal}}
    plan = plan or {}
    method = params.get("method") or ("baseline" if is_baseline else cal.get("method", "darel"))
    uses_alpha = plan.get("subset", "darel") != "full"
    online = plan.get("rule") is not None if plan else not is_baseline
    return {
        "table": params["table"], "model": params["model"], "cell": params["cell"],
        "method": method,
        "profile": params["profile"], "seed": params["seed"], "dataset_label": train["dataset_label"],
        "t": cal.get("t"), "m": cal.get("m"),
        "batch": train["batch"],
        "alpha": cal["alpha"] if not is_baseline and uses_alpha else 1.0,
        "A": cal["A"] if not is_baseline and online else 1.0,
        "eta": cal["eta"] if not is_baseline and online and plan.get("rule") != "uniform" else None,
        "plan": {k: plan[k] for k in ("subset", "rule", "planned_epochs", "predicted_time_s", "predicted_adherence",
                                      "plan_exceeds_budget", "prune_fraction", "anneal_start_epoch", "beta",
                                      "schedule", "schedule_steps", "below_mean_fraction") if k in plan} or None,
        "epochs": train["epochs_completed"], "epochs_planned": train["epochs_planned"],
        "epochs_protocol": train["epochs_protocol"], "enforce": train["enforce"],
        "stopped_by_budget": train["stopped_by_budget"],
        "time_s": train["time_s"], "top1": evaluation["top1"],
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
    }


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--train", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--baseline", required=True, help="the model's baseline train.json")
    ap.add_argument("--calibration", help="the cell's calibration.json (absent for the baseline)")
    ap.add_argument("--plan", help="a study control's plan.json (its method's plan)")
    ap.add_argument("--out-carbon", required=True)
    ap.add_argument("--out-cell", required=True)
    ap.add_argument("--discard-checkpoint", help="the training's checkpoint: removed once the cell JSON is written "
                                                 "(the workflow accepted the training's outputs before this job ran)")
    args = ap.parse_args()
    params, log = stagekit.start(args, "report", writes=Path(args.out_carbon).parent)
    train = provenance.check_train(provenance.read_record(args.train), args.train)
    calibration = (provenance.check_calibration(provenance.read_record(args.calibration), args.calibration)
                   if args.calibration else None)
    evaluation = provenance.check_eval(provenance.read_record(args.eval), args.eval)
    if evaluation.get("model_sha256") != train.get("model_sha256"):
        stagekit.fail(log, f"{args.eval} evaluated another model than the one {args.train} records (model_sha256 "
                           f"{str(evaluation.get('model_sha256'))[:12]}... vs {str(train.get('model_sha256'))[:12]}...); "
                           f"{how_to_recreate(args.eval)}")
    carbon = carbon_record(train["energy"], params["pue"])
    provenance.write_record(args.out_carbon, carbon)
    plan = provenance.read_record(args.plan) if args.plan else None
    cell = build_cell(params, train, evaluation,
                      provenance.check_train(provenance.read_record(args.baseline), args.baseline), calibration,
                      carbon, plan)
    # The records the row was made from, by content (the cell's provenance).
    cell["sources_sha256"] = {name: provenance.sha256_of(path) for name, path in (
        ("train", args.train), ("eval", args.eval), ("baseline_train", args.baseline),
        ("calibration", args.calibration), ("plan", args.plan)) if path}
    provenance.write_record(args.out_cell, cell)
    if args.discard_checkpoint:
        checkpoint.discard(args.discard_checkpoint)
    log.info("cell %s/%s: %.1f s, top1 %.2f %%, %.1f MiB, CO2e %s kg (Eq. 6: %s kg)", cell["model"], cell["cell"],
             cell["time_s"], cell["top1"], cell["peak_mem_bytes"] / 2**20, cell["co2e_kg"], cell["eq6_co2e_kg"])


if __name__ == "__main__":
    main()
