# The image data set of the active profile (Table 1 and its study).


rule download:
    input:
        _download_inputs,
    output:
        L.data_file("train.npz"),
        L.data_file("test.npz"),
        L.data_file("meta.json"),
    params:
        slice=lambda w: as_json(dconfig.dataset_params(CFG)),
        out=lambda w, output: str(Path(output[0]).parent),
    log:
        L.log("download.log"),
    threads: DATA_THREADS
    shell:
        "{PY:q} stages/download.py --params {params.slice:q} --out {params.out:q} --raw data/raw --log {log:q} "
        "--no-progress --workers {threads}"


# The report's page on the data (`make report`): its label, and the generated benchmark's card.
rule data_card:
    input:
        meta=L.data_file("meta.json"),
        card=lambda w: "docs/data_card_synth.md" if CFG["profiles"][PROFILE]["dataset"] == "synth" else [],
    output:
        report(L.data_card(), caption="../report/data_card.rst", category="Data"),
    params:
        card=lambda w, input: f"--card {shlex.quote(str(input.card))}" if input.card else "",
    log:
        L.log("data_card.log"),
    shell:
        "{PY:q} stages/data_card.py --meta {input.meta:q} --out {output:q} {params.card} --log {log:q}"
