# Tables 2 and 3: GPT-2 + LoRA fine-tuning with DAREL offline selection on E2E-NLG
# (Table 2) and WebNLG 2017 (Table 3). One data set, tokenizer and scorer loss file per
# data set; one pretrained model per (data set, model) in the quick profile (tiny GPT-2s
# trained here) or the hub weights in the paper profile; one fine-tuning per cell.


wildcard_constraints:
    dataset="|".join(dconfig.NLG_DATASETS),
    nlg_model="|".join(dconfig.NLG_MODELS),
    nlg_cell=grammar.NLG_CELL,
    table="|".join(dconfig.NLG_TABLES),


rule nlg_data:
    input:
        _nlg_data_inputs,
    output:
        L.nlg_data("train.jsonl"),
        L.nlg_data("dev.jsonl"),
        L.nlg_data("test.jsonl"),
        L.nlg_data("test_refs.txt"),
        L.nlg_data("meta.json"),
    params:
        slice=lambda w: as_json(dconfig.nlg_data_params(CFG, w.dataset)),
        out=lambda w: L.nlg_data(dataset=w.dataset),
    log:
        L.log("nlg", "{dataset}", "data.log"),
    shell:
        "{PY:q} stages/nlg_data.py --params {params.slice:q} --out-dir {params.out:q} --raw data/raw --log {log:q} "
        "--no-progress"


rule nlg_tokenizer:
    input:
        L.nlg_data("train.jsonl"),
        L.nlg_data("test.jsonl"),
        L.nlg_data("meta.json"),
    output:
        directory(L.nlg_shared("tokenizer")),
    params:
        slice=lambda w: as_json(dconfig.nlg_model_params(CFG, w.dataset, CFG["nlg"]["scorer"])),
        data=lambda w, input: str(Path(input[0]).parent),
    log:
        L.log("nlg", "{dataset}", "tokenizer.log"),
    shell:
        "{PY:q} stages/nlg_prepare_model.py --params {params.slice:q} --data-dir {params.data:q} "
        "--tokenizer-dir {output:q} --train-tokenizer --log {log:q}"


rule nlg_pretrain:
    input:
        L.nlg_data("train.jsonl"),
        L.nlg_data("meta.json"),
        tokenizer=L.nlg_shared("tokenizer"),
    output:
        directory(L.nlg_shared("{nlg_model}/pretrained")),
    params:
        slice=lambda w: as_json(dconfig.nlg_model_params(CFG, w.dataset, w.nlg_model)),
        data=lambda w, input: str(Path(input[0]).parent),
    threads: JOB_THREADS
    resources:
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.log("nlg", "{dataset}", "{nlg_model}", "pretrain.log"),
    shell:
        "{PY:q} stages/nlg_prepare_model.py --params {params.slice:q} --data-dir {params.data:q} "
        "--tokenizer-dir {input.tokenizer:q} --out-dir {output:q} --log {log:q} --no-progress"


rule nlg_score:
    input:
        L.nlg_data("train.jsonl"),
        L.nlg_data("meta.json"),
        tokenizer=L.nlg_shared("tokenizer"),
        model=lambda w: L.nlg_shared(f"{CFG['nlg']['scorer']}/pretrained", dataset=w.dataset),
        memory=_scorer_memory,
    output:
        L.nlg_shared("scorer_losses.npz"),
    params:
        slice=lambda w: as_json(dconfig.nlg_finetune_params(CFG, _table_of(w.dataset), CFG["nlg"]["scorer"],
                                                            dconfig.NLG_BASELINE)),
        data=lambda w, input: str(Path(input[0]).parent),
        memory=lambda w, input: ["--memory-from", f"{input.memory[0]}/train.json"] if input.memory else [],
    threads: JOB_THREADS
    resources:
        gpu=GPU_JOB,
        gpu_queue=GPU_QUEUE,
    log:
        L.log("nlg", "{dataset}", "score.log"),
    shell:
        "{PY:q} stages/nlg_score.py --params {params.slice:q} --data-dir {params.data:q} "
        "--tokenizer-dir {input.tokenizer:q} --model-dir {input.model:q} --out {output:q} --log {log:q} "
        "{params.memory:q}"


rule nlg_finetune:
    input:
        data=lambda w: _nlg_data(w, "train.jsonl"),
        meta=lambda w: _nlg_data(w, "meta.json"),
        tokenizer=lambda w: _nlg_shared(w, "tokenizer"),
        model=lambda w: _nlg_shared(w, f"{w.nlg_model}/pretrained"),
        losses=_losses_input,
    output:
        directory(L.nlg_run("adapter")),
    params:
        slice=lambda w: as_json(_finetune_params(w)),
        data_dir=lambda w, input: str(Path(input.data).parent),
        losses=lambda w, input: ["--losses", *input.losses] if input.losses else [],
        launcher=_finetune_launcher,
        checkpoint=lambda w: L.nlg_run("finetune_ckpt.pt", table=w.table, model=w.nlg_model, seed=w.seed,
                                       cell=w.nlg_cell),
        experiment=nlg_experiment,
        key=lambda w: cell_key(w.nlg_model, f"s{w.seed}", w.nlg_cell),
    # Its time and energy enter the table: it runs alone (timed=1) with all cores; a
    # data-parallel fine-tuning asks for one GPU per process. On a cluster each process
    # is a Slurm task with the profile's threads; several are started by srun, on
    # `nodes` nodes (common.smk, FINETUNE_RESOURCES).
    threads: TIMED_THREADS
    resources:
        timed=TIMED_JOB,
        gpu_queue=GPU_QUEUE,
        **FINETUNE_RESOURCES,
    log:
        L.nlg_log("finetune.log"),
    shell:
        "{params.launcher:q} stages/nlg_finetune.py --params {params.slice:q} --data-dir {params.data_dir:q} "
        "--tokenizer-dir {input.tokenizer:q} --model-dir {input.model:q} {params.losses:q} --out-dir {output:q} "
        "--checkpoint {params.checkpoint:q} --tracking-uri {TRACKING_URI:q} --experiment {params.experiment:q} "
        "--cell-key {params.key:q} {LIVE_RUN}--log-file {log:q} --no-progress"


rule nlg_evaluate:
    input:
        data=lambda w: _nlg_data(w, "test.jsonl"),
        meta=lambda w: _nlg_data(w, "meta.json"),
        tokenizer=lambda w: _nlg_shared(w, "tokenizer"),
        model=lambda w: _nlg_shared(w, f"{w.nlg_model}/pretrained"),
        adapter=L.nlg_run("adapter"),
    output:
        hyps=L.nlg_run("hyps.txt"),
        scores=L.nlg_run("eval.json"),
    params:
        slice=lambda w: as_json(_finetune_params(w)),
        data_dir=lambda w, input: str(Path(input.data).parent),
    threads: JOB_THREADS
    resources:
        gpu_queue=GPU_QUEUE,
        **NLG_EVALUATE_GPUS,
    log:
        L.nlg_log("evaluate.log"),
    shell:
        "{PY:q} stages/nlg_evaluate.py --params {params.slice:q} --data-dir {params.data_dir:q} "
        "--tokenizer-dir {input.tokenizer:q} --model-dir {input.model:q} --adapter-dir {input.adapter:q} "
        "--out-hyps {output.hyps:q} --out {output.scores:q} --log {log:q}"


use rule cell_record as nlg_cell_record with:
    wildcard_constraints:
        table="|".join(dconfig.NLG_TABLES),
    input:
        adapter=L.nlg_run("adapter"),
        evaluation=L.nlg_run("eval.json"),
        hyps=L.nlg_run("hyps.txt"),
        meta=lambda w: _nlg_data(w, "meta.json"),
        scorer_losses=_ranked_by_scorer,
    output:
        carbon=L.nlg_run("carbon.json"),
        cell=L.nlg_cell(),
    params:
        slice=lambda w: as_json({**dconfig.report_params(CFG, w.seed), "model": w.nlg_model, "cell": w.nlg_cell,
                                 "table": nlg_experiment(w), "method": dconfig.split_nlg_cell(w.nlg_cell)[1],
                                 "alpha": dconfig.alpha_of(CFG, w.table, dconfig.split_nlg_cell(w.nlg_cell)[0])}),
        train=lambda w, input: f"{input.adapter}/train.json",
        records=report_flags,
        checkpoint=lambda w: L.nlg_run("finetune_ckpt.pt", table=w.table, model=w.nlg_model, seed=w.seed,
                                       cell=w.nlg_cell),
    log:
        L.nlg_log("cell_record.log"),


use rule track_cell as nlg_track with:
    wildcard_constraints:
        table="|".join(dconfig.NLG_TABLES),
    input:
        cell=L.nlg_cell(),
        adapter=L.nlg_run("adapter"),
        artifacts=[L.nlg_run("eval.json"), L.nlg_run("carbon.json")],
    output:
        L.nlg_run("mlflow.json"),
    params:
        slice=lambda w: as_json({"tracking_uri": TRACKING_URI, "experiment": nlg_experiment(w),
                                 "cell_key": cell_key(w.nlg_model, f"s{w.seed}", w.nlg_cell)}),
        train=lambda w, input: f"{input.adapter}/train.json",
        logs=lambda w: existing_logs(L.nlg_log("*.log", table=w.table, model=w.nlg_model, seed=w.seed,
                                               cell=w.nlg_cell)),
    log:
        L.nlg_log("track.log"),


rule nlg_table:
    input:
        nlg_table_inputs,
    output:
        **for_report(L.table_outputs(plot=False), "Tables 2 and 3", "{table}"),
    params:
        profile=PROFILE,  # the active profile's table: a switch rebuilds it from that profile's cells
        cells=lambda w: [L.nlg_cell(table=w.table, model=m, seed=s, cell=c) for m, s, c in dconfig.nlg_cells(CFG, w.table)],
        uri=TRACKING_URI,
    log:
        L.log("{table}", "table.log"),
    shell:
        "{PY:q} stages/nlg_table.py --table {wildcards.table:q} --cells {params.cells:q} --out {output.csv:q} "
        "--compare {output.compare:q} --metrics {output.metrics:q} --tracking-uri {params.uri:q} --profile {params.profile:q} --log {log:q}"
