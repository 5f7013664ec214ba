# Table 1 (ResNet18 on CIFAR-100 / the quick profile's data): per model and seed one
# baseline run (also the offline scorer) and one DAREL run per budget cell. Every path
# holds the profile (darel.layout), so both profiles' runs and cells coexist.


# Priorities: the baselines first, then every calibration, then the trainings. A baseline or a
# calibration holds every core of a CPU machine; done first, they leave the planned trainings
# (one core each with planned_side_by_side) to run in pairs instead of alternating with them.
# Only the order changes: every job reads the same inputs.
rule pretrain_scorer:
    priority: 20
    input:
        L.data_file("train.npz"),
        L.data_file("test.npz"),
    output:
        model=L.table1("model.pt", cell=dconfig.TABLE1_BASELINE),
        train=L.table1("train.json", cell=dconfig.TABLE1_BASELINE),
        evaluation=L.table1("eval.json", cell=dconfig.TABLE1_BASELINE),
    params:
        slice=lambda w: as_json(dconfig.training_params(CFG, w.model, w.seed)),
        data=data_dir,
        out=lambda w: L.table1(model=w.model, seed=w.seed, cell=dconfig.TABLE1_BASELINE),
        key=lambda w: cell_key(w.model, f"s{w.seed}", dconfig.TABLE1_BASELINE),
    threads: TIMED_THREADS
    resources:
        timed=TIMED_JOB,
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.table1_log("pretrain.log", cell=dconfig.TABLE1_BASELINE),
    shell:
        "{PY:q} stages/pretrain.py --params {params.slice:q} --data {params.data:q} --out-dir {params.out:q} "
        "--eval-out {output.evaluation:q} --tracking-uri {TRACKING_URI:q} --experiment table1 --cell-key {params.key:q} "
        "{LIVE_RUN}--log {log:q} --no-progress"


rule score_losses:
    input:
        L.data_file("train.npz"),
        model=L.table1("model.pt", cell=dconfig.TABLE1_BASELINE),
        record=L.table1("train.json", cell=dconfig.TABLE1_BASELINE),
    output:
        L.table1("losses.npz", cell=dconfig.TABLE1_BASELINE),
    params:
        slice=lambda w: as_json(dconfig.training_params(CFG, w.model, w.seed)),
        data=data_dir,
    threads: JOB_THREADS
    resources:
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.table1_log("score.log", cell=dconfig.TABLE1_BASELINE),
    shell:
        "{PY:q} stages/score.py --params {params.slice:q} --data {params.data:q} --model {input.model:q} "
        "--out {output:q} --log {log:q}"


rule calibrate:
    priority: 10
    wildcard_constraints:
        cell=grammar.BUDGET_CELL,
    input:
        L.data_file("train.npz"),
        baseline=L.table1("train.json", cell=dconfig.TABLE1_BASELINE),
    output:
        L.table1("calibration.json"),
    params:
        slice=lambda w: as_json({**dconfig.calibration_params(CFG, w.model, w.cell, w.seed), **reused_calibration(w)}),
        data=data_dir,
    threads: TIMED_THREADS
    resources:
        timed=TIMED_JOB,
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.table1_log("calibrate.log"),
    shell:
        "{PY:q} stages/calibrate.py --params {params.slice:q} --data {params.data:q} --baseline {input.baseline:q} "
        "--out {output:q} --log {log:q}"


rule materialise_subset:
    wildcard_constraints:
        cell=grammar.BUDGET_CELL,
    input:
        L.data_file("train.npz"),
        losses=lambda w: _scorer_run(w, "losses.npz"),
        scorer=lambda w: _scorer_run(w, "model.pt"),
        scorer_record=lambda w: _scorer_run(w, "train.json"),
        calibration=L.table1("calibration.json"),
    output:
        L.table1("subset.npz"),
    params:
        slice=lambda w: as_json({"mode": CFG["darel"]["mode"], "scorer": dconfig.scorer_of(CFG, w.model)}),
        data=data_dir,
    log:
        L.table1_log("subset.log"),
    shell:
        "{PY:q} stages/subset.py --params {params.slice:q} --losses {input.losses:q} --scorer-model {input.scorer:q} "
        "--data {params.data:q} --calibration {input.calibration:q} --out {output:q} --log {log:q}"


rule train_online:
    wildcard_constraints:
        cell=f"{grammar.BUDGET_CELL}|{grammar.IDS_ADONIS}",
    input:
        L.data_file("train.npz"),
        L.data_file("test.npz"),  # its evaluation (eval.json)
        calibration=lambda w: L.table1_settings(model=w.model, seed=w.seed, cell=w.cell),
        subset=L.table1("subset.npz"),
    output:
        model=L.table1("model.pt"),
        train=L.table1("train.json"),
        evaluation=L.table1("eval.json"),
    params:
        slice=lambda w: as_json(dconfig.online_params(CFG, w.model, w.cell, w.seed)),
        data=data_dir,
        out=lambda w: L.table1(model=w.model, seed=w.seed, cell=w.cell),
        key=lambda w: cell_key(w.model, f"s{w.seed}", w.cell),
    threads: PLANNED_THREADS
    resources:
        timed=PLANNED_JOB,
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.table1_log("train.log"),
    shell:
        "{PY:q} stages/train_online.py --params {params.slice:q} --data {params.data:q} "
        "--calibration {input.calibration:q} --subset {input.subset:q} --out-dir {params.out:q} "
        "--eval-out {output.evaluation:q} --tracking-uri {TRACKING_URI:q} --experiment table1 "
        "--cell-key {params.key:q} {LIVE_RUN}--log {log:q} --no-progress"


rule ids_subset:
    input:
        L.data_file("train.npz"),
        model=L.table1("model.pt", cell=dconfig.TABLE1_BASELINE),
        record=L.table1("train.json", cell=dconfig.TABLE1_BASELINE),
    output:
        subset=L.table1("subset.npz", cell=dconfig.IDS_ADONIS),
        plan=L.table1("plan.json", cell=dconfig.IDS_ADONIS),  # the row's fixed ADONIS settings, no budget
    params:
        slice=lambda w: as_json({**dconfig.training_params(CFG, w.model, w.seed),
                                 "ids_adonis": dconfig.ids_adonis_params(CFG)}),
        data=data_dir,
    threads: JOB_THREADS
    resources:
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.table1_log("ids_subset.log", cell=dconfig.IDS_ADONIS),
    shell:
        "{PY:q} stages/ids_subset.py --params {params.slice:q} --data {params.data:q} --model {input.model:q} "
        "--out-subset {output.subset:q} --out-plan {output.plan:q} --log {log:q}"


rule cell_record:
    input:
        unpack(_scorer_costs),
        train=L.table1("train.json"),
        evaluation=L.table1("eval.json"),
        model=L.table1("model.pt"),  # a damaged model stops its cell's record, not only its evaluation
        baseline=L.table1("train.json", cell=dconfig.TABLE1_BASELINE),
        calibration=_calibration_input,
    output:
        carbon=L.table1("carbon.json"),
        cell=L.table1_cell(),
    params:
        slice=lambda w: as_json({**dconfig.report_params(CFG, w.seed), "table": "table1", "model": w.model,
                                 "cell": w.cell}),
        train=lambda w, input: input.train,
        records=report_flags,
        checkpoint=lambda w: L.table1("ckpt.pt", model=w.model, seed=w.seed, cell=w.cell),
    log:
        L.table1_log("cell_record.log"),
    shell:
        "{PY:q} stages/cell_record.py --params {params.slice:q} --train {params.train:q} --eval {input.evaluation:q} "
        "{params.records:q} --out-carbon {output.carbon:q} --out-cell {output.cell:q} "
        "--discard-checkpoint {params.checkpoint:q} --log {log:q}"


rule track_cell:
    input:
        cell=L.table1_cell(),
        train=L.table1("train.json"),
        artifacts=lambda w: [L.table1("carbon.json", model=w.model, seed=w.seed, cell=w.cell), *_calibration_input(w)],
    output:
        L.table1("mlflow.json"),
    params:
        slice=lambda w: as_json({"tracking_uri": TRACKING_URI, "experiment": "table1",
                                 "cell_key": cell_key(w.model, f"s{w.seed}", w.cell)}),
        train=lambda w, input: input.train,
        logs=lambda w: existing_logs(L.table1_log("*.log", model=w.model, seed=w.seed, cell=w.cell)),
    log:
        L.table1_log("track.log"),
    shell:
        "{PY:q} stages/track.py --params {params.slice:q} --cell {input.cell:q} --train {params.train:q} "
        "--artifact {input.artifacts:q} --logs {params.logs:q} --out {output:q} --log {log:q}"


rule table1:
    input:
        table1_inputs,
    output:
        **for_report(L.table_outputs("table1"), "Table 1"),
    params:
        # The table is the active profile's: switching profile rebuilds it from that profile's cells.
        profile=PROFILE,
        cells=lambda w: [L.table1_cell(model=m, seed=s, cell=c) for m, s, c in dconfig.table1_cells(CFG)],
        uri=TRACKING_URI,
    log:
        L.log("table1", "table.log"),
    shell:
        "{PY:q} stages/table1.py --cells {params.cells:q} --out {output.csv:q} --compare {output.compare:q} "
        "--plot {output.plot:q} --metrics {output.metrics:q} --tracking-uri {params.uri:q} --experiment table1 "
        "--profile {params.profile:q} --log {log:q}"
