# Tables 2 and 3: GPT-2 + LoRA fine-tuning with DAREL offline selection on E2E-NLG
# (Table 2) and WebNLG 2017 (Table 3). One data set, tokenizer and scorer loss file per
# data set; one pretrained model per (data set, model) in the quick profile (tiny GPT-2s
# trained here) or the hub weights in the paper profile; one fine-tuning per cell.

NLG_DATA = f"data/nlg_{PROFILE}/{{dataset}}"  # beside, not inside, the DVC-tracked data/<profile>
NLG_RUN = f"runs/{PROFILE}/nlg/{{dataset}}"
NLG_RUN_SHELL = f"runs/{PROFILE}/nlg/{{wildcards.dataset}}"
# One fine-tuning: a table's cell, or a study control of it (a0.70_random, a0.70_easy).
NLG_CELL = f"runs/{PROFILE}/{{table}}/{{nlg_model}}/s{{seed}}/{{nlg_cell}}"
NLG_CELL_SHELL = f"runs/{PROFILE}/{{wildcards.table}}/{{wildcards.nlg_model}}/s{{wildcards.seed}}/{{wildcards.nlg_cell}}"
NLG_CELL_LOGS = f"logs/{PROFILE}/{{table}}/{{nlg_model}}/s{{seed}}/{{nlg_cell}}"
NLG_CELLS = f"results/cells/{PROFILE}"


wildcard_constraints:
    dataset="|".join(dconfig.NLG_DATASETS),
    nlg_model="|".join(dconfig.NLG_MODELS),
    nlg_cell=r"lora|a\d\.\d\d(_random|_easy)?",
    table="table2|table3",


def _table_of(dataset):
    return next(t for t, d in dconfig.NLG_TABLES.items() if CFG[t]["dataset"] == dataset)


def nlg_cell_jsons(wildcards):
    return [f"{NLG_CELLS}/{wildcards.table}/{m}/s{seed}/{c}.json"
            for m, seed, c in dconfig.nlg_cells(CFG, wildcards.table)]


def nlg_tracked(wildcards):
    return [f"runs/{PROFILE}/{wildcards.table}/{m}/s{seed}/{c}/mlflow.json"
            for m, seed, c in dconfig.nlg_cells(CFG, wildcards.table)]


def nlg_experiment(w):
    """A table's cells go to its experiment, a study control's to the study's."""
    return w.table if dconfig.split_nlg_cell(w.nlg_cell)[1] in ("lora", "darel") else f"study_{w.table}"


rule nlg_data:
    output:
        NLG_DATA + "/train.jsonl",
        NLG_DATA + "/dev.jsonl",
        NLG_DATA + "/test.jsonl",
        NLG_DATA + "/test_refs.txt",
        NLG_DATA + "/meta.json",
    params:
        slice=lambda w: as_json(dconfig.nlg_data_params(CFG, w.dataset)),
    log:
        f"logs/{PROFILE}/nlg/{{dataset}}/data.log",
    shell:
        "{PY} stages/nlg_data.py --params {params.slice:q} --out-dir data/nlg_" + PROFILE + "/{wildcards.dataset} "
        "--raw data/raw --log {log} --no-progress"


rule nlg_tokenizer:
    input:
        NLG_DATA + "/train.jsonl",
        NLG_DATA + "/test.jsonl",
    output:
        directory(NLG_RUN + "/tokenizer"),
    params:
        slice=lambda w: as_json(dconfig.nlg_model_params(CFG, w.dataset, CFG["nlg"]["scorer"])),
    log:
        f"logs/{PROFILE}/nlg/{{dataset}}/tokenizer.log",
    shell:
        "{PY} stages/nlg_prepare_model.py --params {params.slice:q} --data-dir data/nlg_" + PROFILE
        + "/{wildcards.dataset} --tokenizer-dir {output} --train-tokenizer --log {log}"


rule nlg_pretrain:
    input:
        NLG_DATA + "/train.jsonl",
        tokenizer=NLG_RUN + "/tokenizer",
    output:
        directory(NLG_RUN + "/{nlg_model}/pretrained"),
    params:
        slice=lambda w: as_json(dconfig.nlg_model_params(CFG, w.dataset, w.nlg_model)),
    resources:
        gpu=GPU_JOB,
    log:
        f"logs/{PROFILE}/nlg/{{dataset}}/{{nlg_model}}/pretrain.log",
    shell:
        "{PY} stages/nlg_prepare_model.py --params {params.slice:q} --data-dir data/nlg_" + PROFILE
        + "/{wildcards.dataset} --tokenizer-dir {input.tokenizer} --out-dir {output} --log {log} --no-progress"


def _scorer_memory(wildcards):
    """train.json of the scorer model's LoRA baseline on this data set, when a table has it:
    on a GPU the per-sample loss batches grow to the peak memory that fine-tuning measured."""
    table = _table_of(wildcards.dataset)
    scorer = CFG["nlg"]["scorer"]
    if scorer not in CFG[table]["models"]:
        return []
    first_seed = dconfig.seeds(CFG)[0]
    return [f"runs/{PROFILE}/{table}/{scorer}/s{first_seed}/{dconfig.NLG_BASELINE}/adapter"]


rule nlg_score:
    input:
        NLG_DATA + "/train.jsonl",
        tokenizer=NLG_RUN + "/tokenizer",
        model=lambda w: f"runs/{PROFILE}/nlg/{w.dataset}/{CFG['nlg']['scorer']}/pretrained",
        memory=_scorer_memory,
    output:
        NLG_RUN + "/scorer_losses.npz",
    params:
        slice=lambda w: as_json(dconfig.nlg_finetune_params(CFG, _table_of(w.dataset), CFG["nlg"]["scorer"],
                                                            dconfig.NLG_BASELINE)),
        memory=lambda w, input: f"--memory-from {input.memory}/train.json" if input.memory else "",
    resources:
        gpu=GPU_JOB,
    log:
        f"logs/{PROFILE}/nlg/{{dataset}}/score.log",
    shell:
        "{PY} stages/nlg_score.py --params {params.slice:q} --data-dir data/nlg_" + PROFILE + "/{wildcards.dataset} "
        "--tokenizer-dir {input.tokenizer} --model-dir {input.model} --out {output} --log {log} {params.memory}"


def _losses_input(wildcards):
    if wildcards.nlg_cell == dconfig.NLG_BASELINE:
        return []
    return [f"runs/{PROFILE}/nlg/{CFG[wildcards.table]['dataset']}/scorer_losses.npz"]


def _nlg_paths(w):
    dataset = CFG[w.table]["dataset"]
    return {"data": f"data/nlg_{PROFILE}/{dataset}", "run": f"runs/{PROFILE}/nlg/{dataset}"}


def _finetune_params(w):
    return dconfig.nlg_finetune_params(CFG, w.table, w.nlg_model, w.nlg_cell, w.seed)


def _finetune_processes(w):
    return _finetune_params(w)["finetune"]["processes"]


def _finetune_launcher(w):
    # More than one process: torchrun starts them and sets up the rendezvous (DDP inside).
    processes = _finetune_processes(w)
    if processes == 1:
        return PY
    return f"{PY} -m torch.distributed.run --standalone --nproc_per_node {processes}"


rule nlg_finetune:
    input:
        data=lambda w: _nlg_paths(w)["data"] + "/train.jsonl",
        tokenizer=lambda w: _nlg_paths(w)["run"] + "/tokenizer",
        model=lambda w: _nlg_paths(w)["run"] + f"/{w.nlg_model}/pretrained",
        losses=_losses_input,
    output:
        directory(NLG_CELL + "/adapter"),
    params:
        slice=lambda w: as_json(_finetune_params(w)),
        data_dir=lambda w: _nlg_paths(w)["data"],
        losses=lambda w, input: f"--losses {input.losses}" if input.losses else "",
        launcher=_finetune_launcher,
        tracking=lambda w: tracking_args(nlg_experiment(w), cell_key(w.nlg_model, f"s{w.seed}", w.nlg_cell)),
    # Its time and energy enter the table: it runs alone (timed=1) with all cores; a
    # data-parallel fine-tuning asks for one GPU per process.
    threads: TIMED_THREADS
    resources:
        timed=1,
        gpu=lambda w: GPU_JOB * _finetune_processes(w),
    log:
        NLG_CELL_LOGS + "/finetune.log",
    shell:
        "{params.launcher} stages/nlg_finetune.py --params {params.slice:q} --data-dir {params.data_dir} "
        "--tokenizer-dir {input.tokenizer} --model-dir {input.model} {params.losses} --out-dir {output} "
        "--checkpoint " + NLG_CELL_SHELL + "/finetune_ckpt.pt {params.tracking} "
        "--log-file {log} --no-progress"


rule nlg_evaluate:
    input:
        data=lambda w: _nlg_paths(w)["data"] + "/test.jsonl",
        tokenizer=lambda w: _nlg_paths(w)["run"] + "/tokenizer",
        model=lambda w: _nlg_paths(w)["run"] + f"/{w.nlg_model}/pretrained",
        adapter=NLG_CELL + "/adapter",
    output:
        hyps=NLG_CELL + "/hyps.txt",
        scores=NLG_CELL + "/eval.json",
    params:
        slice=lambda w: as_json(_finetune_params(w)),
        data_dir=lambda w: _nlg_paths(w)["data"],
    resources:
        gpu=GPU_JOB,
    log:
        NLG_CELL_LOGS + "/evaluate.log",
    shell:
        "{PY} stages/nlg_evaluate.py --params {params.slice:q} --data-dir {params.data_dir} "
        "--tokenizer-dir {input.tokenizer} --model-dir {input.model} --adapter-dir {input.adapter} "
        "--out-hyps {output.hyps} --out {output.scores} --log {log}"


rule nlg_report:
    input:
        adapter=NLG_CELL + "/adapter",
        scores=NLG_CELL + "/eval.json",
        meta=lambda w: _nlg_paths(w)["data"] + "/meta.json",
    output:
        carbon=NLG_CELL + "/carbon.json",
        cell=NLG_CELLS + "/{table}/{nlg_model}/s{seed}/{nlg_cell}.json",
    params:
        slice=lambda w: as_json({**dconfig.report_params(CFG, w.seed), "model": w.nlg_model, "cell": w.nlg_cell,
                                 "table": nlg_experiment(w), "method": dconfig.split_nlg_cell(w.nlg_cell)[1],
                                 "alpha": dconfig.alpha_of(CFG, w.table, dconfig.split_nlg_cell(w.nlg_cell)[0])}),
    log:
        NLG_CELL_LOGS + "/report.log",
    shell:
        "{PY} stages/nlg_report.py --params {params.slice:q} --train {input.adapter}/train.json "
        "--eval {input.scores} --meta {input.meta} --out-carbon {output.carbon} --out-cell {output.cell} "
        "--discard-checkpoint " + NLG_CELL_SHELL + "/finetune_ckpt.pt --log {log}"


rule nlg_track:
    input:
        cell=NLG_CELLS + "/{table}/{nlg_model}/s{seed}/{nlg_cell}.json",
        adapter=NLG_CELL + "/adapter",
        scores=NLG_CELL + "/eval.json",
        carbon=NLG_CELL + "/carbon.json",
    output:
        NLG_CELL + "/mlflow.json",
    params:
        slice=lambda w: as_json({"tracking_uri": TRACKING_URI, "experiment": nlg_experiment(w),
                                 "cell_key": cell_key(w.nlg_model, f"s{w.seed}", w.nlg_cell)}),
        logs=lambda w: existing_logs(NLG_CELL_LOGS.format(table=w.table, nlg_model=w.nlg_model, seed=w.seed,
                                                          nlg_cell=w.nlg_cell) + "/*.log"),
    log:
        NLG_CELL_LOGS + "/track.log",
    shell:
        "{PY} stages/track.py --params {params.slice:q} --cell {input.cell} --train {input.adapter}/train.json "
        "--artifact {input.scores} {input.carbon} --logs {params.logs} --out {output} --log {log}"


rule nlg_table:
    input:
        cells=nlg_cell_jsons,
        tracked=nlg_tracked,
    output:
        csv="results/{table}.csv",
        compare="results/{table}_vs_paper.md",
    params:
        profile=PROFILE,  # the active profile's table: a switch rebuilds it from that profile's cells
    log:
        f"logs/{PROFILE}/{{table}}/table.log",
    shell:
        "{PY} stages/nlg_table.py --table {wildcards.table} --cells {input.cells} --out {output.csv} "
        "--compare {output.compare} --tracking-uri " + TRACKING_URI + " --profile {params.profile} --log {log}"
