# The DAG of the reproduction. Rules only wire stages (stages/*.py) to files;
# every parameter comes from params.yaml (plus --config overrides), validated
# by darel.config before any job runs. DVC calls the targets defined here.
import sys

from darel import config as dconfig


# params.yaml is read here (not with `configfile:`), so that a YAML error names its line
# and a bad value stops the run with one line naming the key, the value and the rule.
try:
    CFG = dconfig.workflow_config("params.yaml", config)
    # A damaged data file is re-created byte for byte (mtime put back) before the DAG is
    # built, so it never makes finished training runs look outdated; else a clear error.
    for _repaired in dconfig.repair_data(CFG, f"data/{CFG['profile']}", "data/raw"):
        print(f"repaired data/{CFG['profile']}/{_repaired} (re-created identical to meta.json's record)")
except dconfig.ConfigError as err:
    sys.exit(f"{err}\n(nothing was run: correct params.yaml or the --config override and run again)")
PROFILE = CFG["profile"]
PY = sys.executable


include: "workflow/rules/common.smk"
include: "workflow/rules/table1.smk"
include: "workflow/rules/nlg.smk"
include: "workflow/rules/study.smk"


rule all:
    input:
        "results/table1.csv",
        # Tables 2/3 when the profile defines its language-model setup.
        [f"results/{table}.csv" for table in dconfig.NLG_TABLES if "nlg" in CFG["profiles"][PROFILE]],
