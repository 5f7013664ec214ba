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
