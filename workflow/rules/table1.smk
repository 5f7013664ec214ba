# Table 1 (ResNet18 on CIFAR-100 / the quick profile's data): per model and seed one
# baseline run (also the offline scorer) and one DAREL run per budget cell. Every path
# holds the profile, so both profiles' runs and cells coexist.

RUN = f"runs/{PROFILE}/table1/{{model}}/s{{seed}}"
DATA = f"data/{PROFILE}"
RUN_SHELL = f"runs/{PROFILE}/table1/{{wildcards.model}}/s{{wildcards.seed}}"  # the same folder, as shell commands spell it
CELLS = f"results/cells/{PROFILE}/table1"
LOGS = f"logs/{PROFILE}/table1/{{model}}/s{{seed}}"
BUDGET_CELL = r"t\d\.\d\d_m\d\.\d\d"


def table1_cell_jsons(wildcards=None):
    return [f"{CELLS}/{model}/s{seed}/{cell}.json" for model, seed, cell in dconfig.table1_cells(CFG)]


def table1_tracked(wildcards=None):
    """The cells' MLflow markers: the table is built once every run is complete."""
    return [f"runs/{PROFILE}/table1/{model}/s{seed}/{cell}/mlflow.json" for model, seed, cell in dconfig.table1_cells(CFG)]


rule pretrain_scorer:
    input:
        DATA + "/train.npz",
        DATA + "/test.npz",
    output:
        model=RUN + "/baseline/model.pt",
        train=RUN + "/baseline/train.json",
    params:
        slice=lambda w: as_json(dconfig.training_params(CFG, w.model, w.seed)),
        tracking=lambda w: tracking_args("table1", cell_key(w.model, f"s{w.seed}", dconfig.TABLE1_BASELINE)),
    threads: TIMED_THREADS
    resources:
        timed=1,
        gpu=GPU_JOB,
    log:
        LOGS + f"/baseline/pretrain.log",
    shell:
        "{PY} stages/pretrain.py --params {params.slice:q} --data " + DATA + " --out-dir " + RUN_SHELL + "/baseline "
        "{params.tracking} --log {log} --no-progress"


rule score_losses:
    input:
        DATA + "/train.npz",
        model=RUN + "/baseline/model.pt",
    output:
        RUN + "/baseline/losses.npz",
    params:
        slice=lambda w: as_json(dconfig.training_params(CFG, w.model, w.seed)),
    resources:
        gpu=GPU_JOB,
    log:
        LOGS + f"/baseline/score.log",
    shell:
        "{PY} stages/score.py --params {params.slice:q} --data " + DATA + " --model {input.model} "
        "--out {output} --log {log}"


rule calibrate:
    wildcard_constraints:
        cell=BUDGET_CELL,
    input:
        DATA + "/train.npz",
        baseline=RUN + "/baseline/train.json",
    output:
        RUN + "/{cell}/calibration.json",
    params:
        slice=lambda w: as_json(dconfig.calibration_params(CFG, w.model, w.cell, w.seed)),
    threads: TIMED_THREADS
    resources:
        timed=1,
        gpu=GPU_JOB,
    log:
        LOGS + f"/{{cell}}/calibrate.log",
    shell:
        "{PY} stages/calibrate.py --params {params.slice:q} --data " + DATA + " --baseline {input.baseline} "
        "--out {output} --log {log}"


def _scorer_run(wildcards):
    """Algorithm 2's losses come from the model's scorer (protocols.<model>.scorer)."""
    return f"runs/{PROFILE}/table1/{dconfig.scorer_of(CFG, wildcards.model)}/s{wildcards.seed}/baseline"


rule materialise_subset:
    wildcard_constraints:
        cell=BUDGET_CELL,
    input:
        DATA + "/train.npz",
        losses=lambda w: _scorer_run(w) + "/losses.npz",
        scorer=lambda w: _scorer_run(w) + "/model.pt",
        calibration=RUN + "/{cell}/calibration.json",
    output:
        RUN + "/{cell}/subset.npz",
    params:
        slice=lambda w: as_json({"mode": CFG["darel"]["mode"], "scorer": dconfig.scorer_of(CFG, w.model)}),
    log:
        LOGS + f"/{{cell}}/subset.log",
    shell:
        "{PY} stages/subset.py --params {params.slice:q} --losses {input.losses} --scorer-model {input.scorer} "
        "--data " + DATA + " --calibration {input.calibration} --out {output} --log {log}"


rule train_online:
    wildcard_constraints:
        cell=BUDGET_CELL + "|" + dconfig.IDS_ADONIS,
    input:
        DATA + "/train.npz",
        calibration=RUN + "/{cell}/calibration.json",
        subset=RUN + "/{cell}/subset.npz",
    output:
        model=RUN + "/{cell}/model.pt",
        train=RUN + "/{cell}/train.json",
    params:
        slice=lambda w: as_json(dconfig.online_params(CFG, w.model, w.cell, w.seed)),
        tracking=lambda w: tracking_args("table1", cell_key(w.model, f"s{w.seed}", w.cell)),
    threads: TIMED_THREADS
    resources:
        timed=1,
        gpu=GPU_JOB,
    log:
        LOGS + f"/{{cell}}/train.log",
    shell:
        "{PY} stages/train_online.py --params {params.slice:q} --data " + DATA + " "
        "--calibration {input.calibration} --subset {input.subset} --out-dir " + RUN_SHELL + "/{wildcards.cell} "
        "{params.tracking} --log {log} --no-progress"


rule ids_subset:
    input:
        DATA + "/train.npz",
        model=RUN + "/baseline/model.pt",
    output:
        subset=RUN + f"/{dconfig.IDS_ADONIS}/subset.npz",
        settings=RUN + f"/{dconfig.IDS_ADONIS}/calibration.json",  # fixed ADONIS settings, no budget
    params:
        slice=lambda w: as_json({**dconfig.training_params(CFG, w.model, w.seed), "ids_adonis": dconfig.ids_adonis_params(CFG)}),
    resources:
        gpu=GPU_JOB,
    log:
        LOGS + f"/{dconfig.IDS_ADONIS}/ids_subset.log",
    shell:
        "{PY} stages/ids_subset.py --params {params.slice:q} --data " + DATA + " --model {input.model} "
        "--out-subset {output.subset} --out-settings {output.settings} --log {log}"


rule evaluate:
    input:
        DATA + "/test.npz",
        model=RUN + "/{cell}/model.pt",
    output:
        RUN + "/{cell}/eval.json",
    params:
        slice=lambda w: as_json(dconfig.training_params(CFG, w.model, w.seed)),
    resources:
        gpu=GPU_JOB,
    log:
        LOGS + f"/{{cell}}/evaluate.log",
    shell:
        "{PY} stages/evaluate.py --params {params.slice:q} --data " + DATA + " --model {input.model} "
        "--out {output} --log {log}"


def _calibration_input(wildcards):
    if wildcards.cell == dconfig.TABLE1_BASELINE:
        return []
    return [RUN.format(model=wildcards.model, seed=wildcards.seed) + f"/{wildcards.cell}/calibration.json"]


rule carbon_report:
    input:
        train=RUN + "/{cell}/train.json",
        evaluation=RUN + "/{cell}/eval.json",
        baseline=RUN + "/baseline/train.json",
        calibration=_calibration_input,
    output:
        carbon=RUN + "/{cell}/carbon.json",
        cell=CELLS + "/{model}/s{seed}/{cell}.json",
    params:
        slice=lambda w: as_json({**dconfig.report_params(CFG, w.seed), "table": "table1", "model": w.model,
                                 "cell": w.cell}),
        calibration=lambda w, input: f"--calibration {input.calibration}" if input.calibration else "",
    log:
        LOGS + f"/{{cell}}/report.log",
    shell:
        "{PY} stages/report.py --params {params.slice:q} --train {input.train} --eval {input.evaluation} "
        "--baseline {input.baseline} {params.calibration} --out-carbon {output.carbon} "
        "--out-cell {output.cell} --discard-checkpoint " + RUN_SHELL + "/{wildcards.cell}/ckpt.pt --log {log}"


rule track_cell:
    input:
        cell=CELLS + "/{model}/s{seed}/{cell}.json",
        train=RUN + "/{cell}/train.json",
        carbon=RUN + "/{cell}/carbon.json",
        calibration=_calibration_input,
    output:
        RUN + "/{cell}/mlflow.json",
    params:
        slice=lambda w: as_json({"tracking_uri": TRACKING_URI, "experiment": "table1",
                                 "cell_key": cell_key(w.model, f"s{w.seed}", w.cell)}),
        logs=lambda w: existing_logs(LOGS.format(model=w.model, seed=w.seed) + f"/{w.cell}/*.log"),
    log:
        LOGS + "/{cell}/track.log",
    shell:
        "{PY} stages/track.py --params {params.slice:q} --cell {input.cell} --train {input.train} "
        "--artifact {input.carbon} {input.calibration} --logs {params.logs} --out {output} --log {log}"


rule table1:
    input:
        cells=table1_cell_jsons,
        tracked=table1_tracked,
    output:
        csv="results/table1.csv",
        compare="results/table1_vs_paper.md",
        plot="results/table1.png",
        metrics="results/table1_metrics.json",
    params:
        # The table is the active profile's: switching profile rebuilds it from that profile's cells.
        profile=PROFILE,
    log:
        f"logs/{PROFILE}/table1/table.log",
    shell:
        "{PY} stages/table.py --cells {input.cells} --out {output.csv} --compare {output.compare} "
        "--plot {output.plot} --metrics {output.metrics} --tracking-uri " + TRACKING_URI + " --experiment table1 "
        "--profile {params.profile} --log {log}"
