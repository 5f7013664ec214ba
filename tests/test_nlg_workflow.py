"""A real tiny end-to-end Snakemake run of one Table 2 cell (LoRA + DAREL, alpha 0.8) on CPU:
synthetic E2E data -> BPE tokenizer -> tiny GPT-2s pretrained here -> scorer losses ->
Algorithm 2 without classes -> LoRA fine-tuning -> beam search -> official metric suite."""

import json
import math

import pytest

from tests.conftest import copy_worktree
from tests.test_workflow import BIN, _run

pytestmark = pytest.mark.slow

TINY = ("profiles={quick: {nlg: {data: {n_train: 40, n_dev: 4, n_test: 6}, pretrain: {epochs: 1}, "
        "finetune: {epochs: 1}, decoding: {max_new_tokens: 16}}}}")


def test_one_table2_cell_end_to_end(tmp_path):
    copy_worktree(tmp_path)
    target = "results/cells/table2/gpt2-small/a0.80.json"
    _run([str(BIN / "snakemake"), "--cores", "2", target, "--config", TINY], tmp_path)
    cell = json.loads((tmp_path / target).read_text())
    for key in ("BLEU", "NIST", "METEOR", "ROUGE_L", "CIDEr", "TER", "time_s", "co2e_kg"):
        assert cell[key] is not None and math.isfinite(cell[key]), key
    assert cell["method"] == "darel" and cell["alpha"] == 0.8
    assert cell["n_train_full"] > 0 and cell["n_train"] == math.ceil(0.8 * cell["n_train_full"])
    assert cell["dataset_label"].startswith("SYNTHETIC")
    hyps = (tmp_path / "runs/quick/table2/gpt2-small/a0.80/hyps.txt").read_text().splitlines()
    assert len(hyps) == cell["n_test"] == 6
