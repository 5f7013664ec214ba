# Studies (beyond the paper): every method of darel/methods at the same budget B(t, m),
# the same calibrated batch and a time plan from the same cost model, over several seeds.
# The darel method and the baselines are Table 1's own runs of the same seed; the
# calibration of a study budget is Table 1's rule too (any budget of table1 or study).

# A training set a study method draws itself (its ``build_subset``, e.g. random: a random
# alpha of every class), shared by the cell's methods that train on it.
rule study_subset:
    wildcard_constraints:
        cell=grammar.BUDGET_CELL,
        subset=OWN_SUBSETS,
    input:
        L.data_file("train.npz"),
        calibration=L.table1("calibration.json"),
    output:
        L.study_subset(),
    params:
        slice=lambda w: as_json({"seed": int(w.seed), "subset": w.subset}),
        data=data_dir,
    log:
        L.study_log("{subset}_subset.log"),
    shell:
        "{PY:q} stages/study_subset.py --params {params.slice:q} --data {params.data:q} "
        "--calibration {input.calibration:q} --out {output:q} --log {log:q}"


rule study_train:
    wildcard_constraints:
        cell=grammar.BUDGET_CELL,
        method=CONTROL,
    input:
        L.data_file("train.npz"),
        L.data_file("test.npz"),  # its evaluation (eval.json)
        unpack(_control_inputs),
    output:
        model=L.study("model.pt", method="{method}"),
        train=L.study("train.json", method="{method}"),
        plan=L.study("plan.json", method="{method}"),
        evaluation=L.study("eval.json", method="{method}"),
    params:
        slice=lambda w: as_json(dconfig.control_params(CFG, w.model, w.cell, w.seed, w.method)),
        flags=_optional_flags,
        data=data_dir,
        out=lambda w: L.study(model=w.model, seed=w.seed, cell=w.cell, method=w.method),
        key=lambda w: cell_key(w.model, f"s{w.seed}", w.cell, w.method),
    threads: PLANNED_THREADS
    resources:
        timed=PLANNED_JOB,
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.study_log("train.log", method="{method}"),
    shell:
        "{PY:q} stages/train_control.py --params {params.slice:q} --data {params.data:q} "
        "--calibration {input.calibration:q} {params.flags:q} --out-dir {params.out:q} "
        "--eval-out {output.evaluation:q} --tracking-uri {TRACKING_URI:q} --experiment study_table1 "
        "--cell-key {params.key:q} {LIVE_RUN}--log {log:q} --no-progress"


use rule cell_record as study_cell_record with:
    wildcard_constraints:
        cell=grammar.BUDGET_CELL,
        method=CONTROL,
    input:
        train=L.study("train.json", method="{method}"),
        evaluation=L.study("eval.json", method="{method}"),
        model=L.study("model.pt", method="{method}"),
        baseline=L.table1("train.json", cell=dconfig.TABLE1_BASELINE),
        calibration=L.table1("calibration.json"),
        scorer_train=lambda w: _scorer_run(w, "train.json"),
        scorer_losses=lambda w: _scorer_run(w, "losses.npz"),
    output:
        carbon=L.study("carbon.json", method="{method}"),
        cell=L.study_cell(),
    params:
        slice=lambda w: as_json({**dconfig.report_params(CFG, w.seed), "table": "study_table1", "model": w.model,
                                 "cell": w.cell, "method": w.method}),
        train=lambda w, input: input.train,
        records=report_flags,
        checkpoint=lambda w: L.study("ckpt.pt", model=w.model, seed=w.seed, cell=w.cell, method=w.method),
    log:
        L.study_log("cell_record.log", method="{method}"),


use rule track_cell as study_track with:
    wildcard_constraints:
        cell=grammar.BUDGET_CELL,
        method=CONTROL,
    input:
        cell=L.study_cell(),
        train=L.study("train.json", method="{method}"),
        artifacts=[L.study("plan.json", method="{method}"), L.study("carbon.json", method="{method}")],
    output:
        L.study("mlflow.json", method="{method}"),
    params:
        slice=lambda w: as_json({"tracking_uri": TRACKING_URI, "experiment": "study_table1",
                                 "cell_key": cell_key(w.model, f"s{w.seed}", w.cell, w.method)}),
        train=lambda w, input: input.train,
        logs=lambda w: existing_logs(L.study_log("*.log", model=w.model, seed=w.seed, cell=w.cell, method=w.method)),
    log:
        L.study_log("track.log", method="{method}"),


# A study declared in the fitting regime (study.table1.fit_check.<profile>): each seed's
# baseline's top-1 on its whole training set and its test curve's last quarter, which the
# verdict file prints and checks. It reads the baseline's files only: nothing retrains.
rule baseline_fit:
    input:
        L.data_file("train.npz"),
        model=L.table1("model.pt", cell=dconfig.TABLE1_BASELINE),
        record=L.table1("train.json", cell=dconfig.TABLE1_BASELINE),
    output:
        L.baseline_fit(),
    params:
        slice=lambda w: as_json(dconfig.training_params(CFG, w.model, w.seed)),
        data=data_dir,
    threads: JOB_THREADS
    resources:
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.table1_log("fit.log", cell=dconfig.TABLE1_BASELINE),
    shell:
        "{PY:q} stages/baseline_fit.py --params {params.slice:q} --data {params.data:q} --model {input.model:q} "
        "--out {output:q} --log {log:q}"


rule study_table1:
    input:
        study_table1_inputs,
    output:
        **for_report(L.study_outputs("study_table1", composition=True), "Studies", "Table 1"),
    params:
        profile=PROFILE,
        cells=study_table1_cells,
        slice=lambda w: as_json({"tracking_uri": TRACKING_URI, "profile": PROFILE, "study": "study_table1",
                                 "methods": dconfig.study_methods(CFG), "seeds": dconfig.study_seeds(CFG),
                                 **dconfig.study_verdict_params(CFG, "table1"), **study_fit_records()}),
    log:
        L.log("study_table1", "table.log"),
    shell:
        "{PY:q} stages/study_table.py --kind table1 --params {params.slice:q} --cells {params.cells:q} "
        "--out {output.rows:q} --summary {output.summary:q} --plot {output.plot:q} --verdict {output.verdict:q} "
        "--metrics {output.metrics:q} --composition {output.composition:q} --log {log:q}"


# Tables 2/3: LoRA + DAREL (the table's alpha cell), LoRA on a random subset of the same
# alpha and on the lowest-loss (EASY) subset, over the study's seeds. The controls are
# fine-tunings of the NLG rules under the cell ids a<alpha>_random and a<alpha>_easy.
rule study_nlg_table:
    wildcard_constraints:
        nlg_table="|".join(dconfig.NLG_TABLES),
    input:
        study_nlg_inputs,
    output:
        **for_report(L.study_outputs("study_{nlg_table}"), "Studies", "{nlg_table}"),
    params:
        profile=PROFILE,
        cells=lambda w: [L.nlg_cell(table=w.nlg_table, model=m, seed=s, cell=c)
                         for m, s, c in dconfig.study_nlg_cells(CFG, w.nlg_table)],
        slice=lambda w: as_json({"tracking_uri": TRACKING_URI, "profile": PROFILE,
                                 "study": f"study_{w.nlg_table}", "methods": CFG["study"][w.nlg_table]["methods"],
                                 "seeds": dconfig.study_seeds(CFG),
                                 **dconfig.study_verdict_params(CFG, w.nlg_table)}),
    log:
        L.log("study_{nlg_table}", "table.log"),
    shell:
        "{PY:q} stages/study_table.py --kind nlg --params {params.slice:q} --cells {params.cells:q} "
        "--out {output.rows:q} --summary {output.summary:q} --plot {output.plot:q} --verdict {output.verdict:q} "
        "--metrics {output.metrics:q} --log {log:q}"
