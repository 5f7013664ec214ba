"""Stage "carbon report" for Tables 2/3: the cell JSON (scores, time, memory, energy,
Eq. 6 cross-check); the cell's MLflow run is completed by its own job (stages/track.py)."""

from __future__ import annotations


from darel import checkpoint, provenance, stagekit
from darel.measure import carbon_record
from darel.nlg.metrics import METRIC_KEYS, VARIANT_KEYS




def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--train", required=True)
    ap.add_argument("--eval", required=True)
    ap.add_argument("--meta", required=True, help="the data set's meta.json")
    ap.add_argument("--out-carbon", required=True)
    ap.add_argument("--out-cell", required=True)
    ap.add_argument("--discard-checkpoint", help="the fine-tuning's checkpoint, removed once the cell JSON is written")
    args = ap.parse_args()
    params, log = stagekit.start(args, "nlg_report")
    train, scores = provenance.read_record(args.train), provenance.read_record(args.eval)
    if scores.get("adapter_sha256") != provenance.sha256_of(args.train):
        stagekit.fail(log, f"{args.eval} scored another adapter than the one {args.train} describes; "
                           f"{provenance.how_to_recreate(args.eval)}")
    carbon = carbon_record(train["energy"], params["pue"])
    provenance.write_record(args.out_carbon, carbon)
    cell = {"table": params["table"], "model": params["model"], "cell": params["cell"],
            "method": params.get("method") or ("lora" if params["alpha"] is None else "darel"),
            "alpha": params["alpha"],
            "profile": params["profile"], "seed": params["seed"], "dataset_label": provenance.read_record(args.meta)["label"],
            **{k: scores[k] for k in METRIC_KEYS},
            # absent when eval.json came from the scorer without --variants
            **{k: scores.get(k) for k in VARIANT_KEYS},
            "time_s": train["time_s"], "peak_mem_bytes": train["peak_mem_bytes"],
            "memory_source": train["memory_source"], "energy_kwh": carbon.get("energy_kwh"),
            "co2e_kg": carbon.get("co2e_kg"), "eq6_co2e_kg": carbon.get("eq6_co2e_kg"),
            "energy_source": carbon.get("energy_source"), "energy_covers": carbon.get("energy_covers"),
            "n_train": train["n_train"],
            "n_train_full": train["n_train_full"], "n_test": scores["n_test"],
            "n_outputs_cut": scores.get("n_outputs_cut"), "device": train["device"]}
    cell["sources_sha256"] = {"train": provenance.sha256_of(args.train), "eval": provenance.sha256_of(args.eval)}
    provenance.write_record(args.out_cell, cell)
    if args.discard_checkpoint:
        checkpoint.discard(args.discard_checkpoint)
    log.info("cell %s/%s: BLEU %.4f in %.1f s", cell["model"], cell["cell"], cell["BLEU"], cell["time_s"])


if __name__ == "__main__":
    main()
