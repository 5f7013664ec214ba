"""Parameters: loading, validation and the per-stage slices.

``params.yaml`` is the only place a parameter is set. Snakemake and DVC both read
it; Snakemake merges ``--config`` overrides on top. Everything is validated before
any stage runs (``schema``), each table's cells are listed in one place (``cells``),
and each stage receives only the slice of parameters it depends on (``slices``), so
that changing one value re-runs only the jobs that use it. Everything is importable
from ``darel.config`` directly, as before the split.
"""

from darel.config.cells import (alpha_cell, alpha_of, budget_of, cell_id, nlg_cells, nlg_study_cell,
                                parse_cell, seeds, split_nlg_cell, study_budgets, study_methods, study_nlg_cells,
                                study_fit_baselines, study_fit_check, study_runs, study_seeds, study_table1_cells,
                                study_trains_darel, table1_budgets, table1_cells)
from darel.config.errors import ConfigError
from darel.config.schema import (KNOWN_ALGEBRAS, KNOWN_DATASETS, KNOWN_MODELS, NLG_DATASETS,
                                 NLG_MODELS, NLG_STUDY_METHODS, NLG_TABLES, SCHEMA, check_grammar,
                                 coerce_cli_scalars, load_params, merge, params_file, read_yaml, validate,
                                 workflow_config)
from darel.config.slices import (calibration_params, control_params, dataset_params, ids_adonis_params,
                                 model_protocol, nlg_data_params, nlg_finetune_params, nlg_finetune_settings,
                                 nlg_model_params, nlg_precision, nlg_synthetic, online_params, report_params,
                                 runtime_params, scorer_of, study_verdict_params, training_params)
from darel.grammar import IDS_ADONIS, NLG_BASELINE, TABLE1_BASELINE

__all__ = [
    "IDS_ADONIS",
    "NLG_BASELINE",
    "TABLE1_BASELINE",
    "alpha_cell",
    "alpha_of",
    "budget_of",
    "calibration_params",
    "cell_id",
    "check_grammar",
    "coerce_cli_scalars",
    "ConfigError",
    "control_params",
    "dataset_params",
    "ids_adonis_params",
    "KNOWN_ALGEBRAS",
    "KNOWN_DATASETS",
    "KNOWN_MODELS",
    "load_params",
    "merge",
    "model_protocol",
    "nlg_cells",
    "nlg_data_params",
    "NLG_DATASETS",
    "nlg_finetune_params",
    "nlg_finetune_settings",
    "nlg_model_params",
    "NLG_MODELS",
    "nlg_precision",
    "nlg_study_cell",
    "NLG_STUDY_METHODS",
    "nlg_synthetic",
    "params_file",
    "NLG_TABLES",
    "online_params",
    "parse_cell",
    "read_yaml",
    "report_params",
    "runtime_params",
    "SCHEMA",
    "scorer_of",
    "seeds",
    "split_nlg_cell",
    "study_budgets",
    "study_nlg_cells",
    "study_methods",
    "study_fit_baselines",
    "study_fit_check",
    "study_runs",
    "study_seeds",
    "study_table1_cells",
    "study_trains_darel",
    "study_verdict_params",
    "table1_budgets",
    "table1_cells",
    "training_params",
    "validate",
    "workflow_config",
]
