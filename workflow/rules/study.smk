# Studies (beyond the paper): every method of darel/controls at the same budget B(t, m),
# the same calibrated batch and a time plan from the same cost model, over several seeds.
# The darel method and the baselines are Table 1's own runs of the same seed; the
# calibration of a study budget is Table 1's rule too (any budget of table1 or study).
from darel.controls import plans as control_plans

STUDY = f"runs/{PROFILE}/study_table1/{{model}}/s{{seed}}/{{cell}}"
STUDY_SHELL = f"runs/{PROFILE}/study_table1/{{wildcards.model}}/s{{wildcards.seed}}/{{wildcards.cell}}"
STUDY_CELLS = f"results/cells/{PROFILE}/study_table1"
STUDY_LOGS = f"logs/{PROFILE}/study_table1/{{model}}/s{{seed}}/{{cell}}"
T1 = f"runs/{PROFILE}/table1/{{model}}/s{{seed}}"
CONTROL = "|".join(m for m in dconfig.CONTROL_METHODS if m != "darel")


def study_table1_inputs(wildcards=None):
    """Every row of the study: control cells, and Table 1's darel and baseline cells of the same seeds."""
    files = set()
    for model, seed, cell, method in dconfig.study_table1_cells(CFG):
        files.add(f"{CELLS}/{model}/s{seed}/{dconfig.TABLE1_BASELINE}.json")
        files.add(f"{CELLS}/{model}/s{seed}/{cell}.json" if method == "darel"
                  else f"{STUDY_CELLS}/{model}/s{seed}/{cell}/{method}.json")
    return sorted(files)


def study_table1_tracked(wildcards=None):
    """The MLflow markers of the controls' runs (the table's own cells are tracked by Table 1)."""
    return sorted({f"runs/{PROFILE}/study_table1/{model}/s{seed}/{cell}/{method}/mlflow.json"
                   for model, seed, cell, method in dconfig.study_table1_cells(CFG) if method != "darel"})


rule study_random_subset:
    wildcard_constraints:
        cell=BUDGET_CELL,
    input:
        DATA + "/train.npz",
        calibration=T1 + "/{cell}/calibration.json",
    output:
        STUDY + "/random_subset.npz",
    params:
        slice=lambda w: as_json({"seed": int(w.seed)}),
    log:
        STUDY_LOGS + "/random_subset.log",
    shell:
        "{PY} stages/study_subset.py --params {params.slice:q} --data " + DATA + " --calibration {input.calibration} "
        "--out {output} --log {log}"


def _control_inputs(wildcards):
    t1 = T1.format(model=wildcards.model, seed=wildcards.seed)
    found = {"calibration": f"{t1}/{wildcards.cell}/calibration.json"}
    subset = control_plans.SUBSET_OF[wildcards.method]
    if subset == "darel":
        found["subset"] = f"{t1}/{wildcards.cell}/subset.npz"
    elif subset == "random":
        found["subset"] = STUDY.format(**wildcards) + "/random_subset.npz"
    if wildcards.method == "infobatch":
        scorer = dconfig.scorer_of(CFG, wildcards.model)
        found["losses"] = f"runs/{PROFILE}/table1/{scorer}/s{wildcards.seed}/baseline/losses.npz"
        found["scorer"] = f"runs/{PROFILE}/table1/{scorer}/s{wildcards.seed}/baseline/model.pt"
    return found


def _optional_flags(wildcards, input):
    return " ".join(f"--{name.replace('_', '-')} {getattr(input, name)}" for name in ("subset", "losses", "scorer")
                    if hasattr(input, name))


rule study_train:
    wildcard_constraints:
        cell=BUDGET_CELL,
        method=CONTROL,
    input:
        DATA + "/train.npz",
        unpack(_control_inputs),
    output:
        model=STUDY + "/{method}/model.pt",
        train=STUDY + "/{method}/train.json",
        plan=STUDY + "/{method}/plan.json",
    params:
        slice=lambda w: as_json(dconfig.control_params(CFG, w.model, w.cell, w.seed, w.method)),
        flags=_optional_flags,
        tracking=lambda w: tracking_args("study_table1", cell_key(w.model, f"s{w.seed}", w.cell, w.method)),
    threads: TIMED_THREADS
    resources:
        timed=1,
        gpu=GPU_JOB,
    log:
        STUDY_LOGS + "/{method}/train.log",
    shell:
        "{PY} stages/train_control.py --params {params.slice:q} --data " + DATA + " "
        "--calibration {input.calibration} {params.flags} --out-dir " + STUDY_SHELL + "/{wildcards.method} "
        "{params.tracking} --log {log} --no-progress"


rule study_evaluate:
    wildcard_constraints:
        cell=BUDGET_CELL,
        method=CONTROL,
    input:
        DATA + "/test.npz",
        model=STUDY + "/{method}/model.pt",
    output:
        STUDY + "/{method}/eval.json",
    params:
        slice=lambda w: as_json(dconfig.training_params(CFG, w.model, w.seed)),
    resources:
        gpu=GPU_JOB,
    log:
        STUDY_LOGS + "/{method}/evaluate.log",
    shell:
        "{PY} stages/evaluate.py --params {params.slice:q} --data " + DATA + " --model {input.model} "
        "--out {output} --log {log}"


rule study_report:
    wildcard_constraints:
        cell=BUDGET_CELL,
        method=CONTROL,
    input:
        train=STUDY + "/{method}/train.json",
        evaluation=STUDY + "/{method}/eval.json",
        plan=STUDY + "/{method}/plan.json",
        baseline=T1 + "/baseline/train.json",
        calibration=T1 + "/{cell}/calibration.json",
    output:
        carbon=STUDY + "/{method}/carbon.json",
        cell=STUDY_CELLS + "/{model}/s{seed}/{cell}/{method}.json",
    params:
        slice=lambda w: as_json({**dconfig.report_params(CFG, w.seed), "table": "study_table1", "model": w.model,
                                 "cell": w.cell, "method": w.method}),
    log:
        STUDY_LOGS + "/{method}/report.log",
    shell:
        "{PY} stages/report.py --params {params.slice:q} --train {input.train} --eval {input.evaluation} "
        "--baseline {input.baseline} --calibration {input.calibration} --plan {input.plan} "
        "--out-carbon {output.carbon} --out-cell {output.cell} "
        "--discard-checkpoint " + STUDY_SHELL + "/{wildcards.method}/ckpt.pt --log {log}"


rule study_track:
    wildcard_constraints:
        cell=BUDGET_CELL,
        method=CONTROL,
    input:
        cell=STUDY_CELLS + "/{model}/s{seed}/{cell}/{method}.json",
        train=STUDY + "/{method}/train.json",
        plan=STUDY + "/{method}/plan.json",
        carbon=STUDY + "/{method}/carbon.json",
    output:
        STUDY + "/{method}/mlflow.json",
    params:
        slice=lambda w: as_json({"tracking_uri": TRACKING_URI, "experiment": "study_table1",
                                 "cell_key": cell_key(w.model, f"s{w.seed}", w.cell, w.method)}),
        logs=lambda w: existing_logs(STUDY_LOGS.format(model=w.model, seed=w.seed, cell=w.cell) + f"/{w.method}/*.log"),
    log:
        STUDY_LOGS + "/{method}/track.log",
    shell:
        "{PY} stages/track.py --params {params.slice:q} --cell {input.cell} --train {input.train} "
        "--artifact {input.plan} {input.carbon} --logs {params.logs} --out {output} --log {log}"


rule study_table1:
    input:
        cells=study_table1_inputs,
        tracked=study_table1_tracked,
    output:
        rows="results/study_table1.csv",
        summary="results/study_table1_summary.csv",
        plot="results/study_table1.png",
        verdict="results/study_table1.md",
        metrics="results/study_table1_metrics.json",
    params:
        profile=PROFILE,
        slice=lambda w: as_json({"tracking_uri": CFG["tracking"]["uri"], "profile": PROFILE, "study": "study_table1",
                                 "methods": CFG["study"]["table1"]["methods"], "seeds": dconfig.study_seeds(CFG)}),
    log:
        f"logs/{PROFILE}/study_table1/table.log",
    shell:
        "{PY} stages/study_table.py --kind table1 --params {params.slice:q} --cells {input.cells} --out {output.rows} "
        "--summary {output.summary} --plot {output.plot} --verdict {output.verdict} --metrics {output.metrics} "
        "--log {log}"


# Tables 2/3: LoRA + DAREL (the table's alpha cell), LoRA on a random subset of the same
# alpha and on the lowest-loss (EASY) subset, over the study's seeds. The controls are
# fine-tunings of the NLG rules under the cell ids a<alpha>_random and a<alpha>_easy.
def study_nlg_inputs(wildcards):
    table = wildcards.nlg_table
    return [f"{NLG_CELLS}/{table}/{model}/s{seed}/{cell}.json"
            for model, seed, cell in dconfig.study_nlg_cells(CFG, table)]


def study_nlg_tracked(wildcards):
    table = wildcards.nlg_table
    return [f"runs/{PROFILE}/{table}/{model}/s{seed}/{cell}/mlflow.json"
            for model, seed, cell in dconfig.study_nlg_cells(CFG, table)]


rule study_nlg_table:
    wildcard_constraints:
        nlg_table="table2|table3",
    input:
        cells=study_nlg_inputs,
        tracked=study_nlg_tracked,
    output:
        rows="results/study_{nlg_table}.csv",
        summary="results/study_{nlg_table}_summary.csv",
        plot="results/study_{nlg_table}.png",
        verdict="results/study_{nlg_table}.md",
        metrics="results/study_{nlg_table}_metrics.json",
    params:
        profile=PROFILE,
        slice=lambda w: as_json({"tracking_uri": CFG["tracking"]["uri"], "profile": PROFILE,
                                 "study": f"study_{w.nlg_table}", "methods": CFG["study"][w.nlg_table]["methods"],
                                 "seeds": dconfig.study_seeds(CFG)}),
    log:
        f"logs/{PROFILE}/study_{{nlg_table}}/table.log",
    shell:
        "{PY} stages/study_table.py --kind nlg --params {params.slice:q} --cells {input.cells} --out {output.rows} "
        "--summary {output.summary} --plot {output.plot} --verdict {output.verdict} --metrics {output.metrics} "
        "--log {log}"
