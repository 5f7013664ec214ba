# The DAG of the reproduction. Rules only wire stages (stages/*.py) to files;
# every parameter comes from params.yaml (plus --config overrides), validated
# by darel.config before any job runs. DVC calls the targets defined here.
import sys

from darel import config as dconfig


configfile: "params.yaml"


CFG = dconfig.validate(dconfig.coerce_cli_scalars(config))
PROFILE = CFG["profile"]
PY = sys.executable

# A damaged data file is re-created byte for byte (mtime put back) before the DAG is
# built, so it never makes finished training runs look outdated; else a clear error.
for _repaired in dconfig.repair_data(CFG, f"data/{PROFILE}", "data/raw"):
    print(f"repaired data/{PROFILE}/{_repaired} (re-created from its source, identical to meta.json's record)")


include: "workflow/rules/common.smk"
include: "workflow/rules/table1.smk"
include: "workflow/rules/nlg.smk"
include: "workflow/rules/study.smk"


rule all:
    input:
        "results/table1.csv",
        # Tables 2/3 when the profile defines its language-model setup.
        [f"results/{table}.csv" for table in dconfig.NLG_TABLES if "nlg" in CFG["profiles"][PROFILE]],
