"""Data-parallel LoRA fine-tuning: the stage started by torchrun on 2 CPU processes
(Gloo) must train the same adapter as one process on the same global batches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from darel import launch
from darel.nlg.schemas import training_pairs, write_split
from darel.provenance import write_folder_record
from darel.nlg.synthetic import make_synthetic_e2e
from darel.nlg.lm import build_lm, tiny_gpt2_config
from darel.nlg.tokenizer import save_tokenizer, train_bpe_tokenizer
from tests.conftest import copy_worktree
from tests.test_workflow import BIN

ROOT = Path(__file__).resolve().parents[1]
BATCH = 8


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return build_inputs(tmp_path_factory.mktemp("ddp"))


def build_inputs(root: Path) -> dict:
    """The tiny data, tokenizer and GPT-2 of these fine-tunings, under ``root``."""
    examples = make_synthetic_e2e(12, refs_per_mr=(2, 3), seed=5)
    pairs = training_pairs(examples)
    # A last global batch of one pair leaves the second process without a share.
    while len(pairs) % BATCH != 1:
        examples = examples[:-1]
        pairs = training_pairs(examples)
    data = root / "data"
    data.mkdir(parents=True)
    write_split(data / "train.jsonl", examples)
    write_folder_record(data, "meta.json", {"dataset": "e2e", "label": "test"})  # the folders sealed as the stages do
    tokenizer = train_bpe_tokenizer([t for pair in pairs for t in pair], vocab_size=400, min_frequency=2)
    save_tokenizer(tokenizer, root / "tokenizer")
    write_folder_record(root / "tokenizer", "lengths.json")
    config = tiny_gpt2_config(len(tokenizer), n_embd=32, n_layer=2, n_head=2, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)
    # No dropout anywhere, so that 1 and 2 processes compute the same function.
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    build_lm(config, seed=0).save_pretrained(root / "model")
    write_folder_record(root / "model", "pretrain.json")
    return {"root": root, "n_pairs": len(pairs)}


def _params() -> str:
    return json.dumps({
        "device": "cpu", "threads": 1, "seed": 0, "amp": False, "precision": "fp32", "alpha": None, "mode": "hard",
        "lora": {"r": 4, "alpha": 32, "dropout": 0.0},
        "finetune": {"lr": 5e-3, "betas": [0.9, 0.999], "weight_decay": 0.01, "warmup_steps": 2,
                     "label_smoothing": 0.1, "epochs": 2, "batch": BATCH, "max_length": 128, "processes": 1},
        "carbon": {"country_iso_code": "USA", "pue": 1.0, "measure_power_secs": 1.0},
    })


def _stage(inputs, out: Path) -> list[str]:
    root = inputs["root"]
    return [str(ROOT / "stages" / "nlg_finetune.py"), "--params", _params(), "--data-dir", str(root / "data"),
            "--tokenizer-dir", str(root / "tokenizer"), "--model-dir", str(root / "model"),
            "--out-dir", str(out), "--log-file", str(out.parent / f"{out.name}.log"), "--no-progress",
            "--checkpoint", str(out.parent / f"{out.name}_ckpt.pt")]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MLFLOW_DISABLE_TELEMETRY": "true"}


def _finetune(inputs, out: Path, processes: int) -> dict:
    launcher = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    proc = subprocess.run(launcher + _stage(inputs, out), cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "train.json").read_text())


def _job_with_a_free_port() -> str:
    """A Slurm job id whose derived rendezvous port (darel.launch) is free here."""
    for job in range(48213, 58213):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", launch.PORT_BASE + job % 10000))
            except OSError:
                continue
            return str(job)
    raise RuntimeError("no free port in 15000-24999")


def _finetune_as_srun_tasks(inputs, out: Path, tasks: int) -> dict:
    """The stage started as srun starts it: ``tasks`` plain processes, each with the
    variables srun sets for one task of a step on one node (and none of torchrun's)."""
    job = _job_with_a_free_port()
    env = {k: v for k, v in ENV.items() if not k.startswith("SLURM_") and k not in
           ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    procs = [subprocess.Popen([sys.executable, *_stage(inputs, out)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**env, "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_NTASKS": str(tasks),
                                   "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
                                   "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_NODELIST": "localhost"})
             for rank in range(tasks)]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), "\n".join(o[-3000:] for o in outputs)
    return json.loads((out / "train.json").read_text())


def test_two_processes_train_the_same_adapter_as_one(inputs, tmp_path):
    single = _finetune(inputs, tmp_path / "one", 1)
    double = _finetune(inputs, tmp_path / "two", 2)
    assert (single["processes"], double["processes"]) == (1, 2)
    steps = 2 * -(-inputs["n_pairs"] // BATCH)
    assert single["steps"] == double["steps"] == steps
    # Counters are summed over the processes: the same tokens went through the model.
    assert double["tokens_trained"] == single["tokens_trained"]
    assert double["target_tokens"] == single["target_tokens"]
    assert double["train_loss"] == pytest.approx(single["train_loss"], rel=1e-4)
    one = load_file(tmp_path / "one" / "adapter_model.safetensors")
    two = load_file(tmp_path / "two" / "adapter_model.safetensors")
    assert one.keys() == two.keys() and len(one) > 0
    # lora_B starts at zero: nonzero means the adapters were trained, not just saved.
    assert any(float(t.abs().max()) > 0 for k, t in one.items() if "lora_B" in k)
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-5, msg=key)
    # Per-epoch checkpoints (gathered random states under DDP) are written; the last one stays
    # until the cell-record stage removes it (once the workflow has accepted the adapter).
    from darel import checkpoint

    for name in ("one_ckpt.pt", "two_ckpt.pt"):
        assert checkpoint.loads((tmp_path / name).read_bytes())["loop"]["epoch"] == 2
    assert double["resumed_from_epoch"] is None and "whole run" in double["energy_covers"]
    # Only process 0 writes; the other process keeps its own log.
    assert (tmp_path / "two.log").is_file() and (tmp_path / "two.log.rank1").is_file()


def test_ranks_started_by_srun_train_the_adapter_of_torchrun_byte_for_byte(inputs, tmp_path):
    # Two ranks that learn their place from Slurm's variables (darel.launch) run the same
    # 2-process group as torchrun's: the same shares of every global batch, the same Gloo
    # reductions, so the same adapter bytes. Against one process the adapter agrees to
    # rounding (the test above: the loss is summed over two shares instead of one).
    torchrun = _finetune(inputs, tmp_path / "torchrun", 2)
    srun = _finetune_as_srun_tasks(inputs, tmp_path / "srun", 2)
    assert srun["processes"] == torchrun["processes"] == 2 and srun["steps"] == torchrun["steps"]
    adapter = "adapter_model.safetensors"
    assert (tmp_path / "srun" / adapter).read_bytes() == (tmp_path / "torchrun" / adapter).read_bytes()
    assert any(float(t.abs().max()) > 0 for k, t in load_file(tmp_path / "srun" / adapter).items() if "lora_B" in k)
    assert (tmp_path / "srun.log.rank1").is_file()  # rank 1 knew it was not process 0


def test_workflow_starts_several_processes_through_torchrun(tmp_path):
    copy_worktree(tmp_path)
    # A dry run prints the command the fine-tuning job would run under a 2-process setting.
    proc = subprocess.run(
        [str(BIN / "snakemake"), "-n", "-p", "--cores", "2", "runs/quick/table2/gpt2-small/s0/lora/adapter",
         "--config", "nlg={finetune: {processes: 2}}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "-m torch.distributed.run --standalone --nproc_per_node 2 stages/nlg_finetune.py" in proc.stdout
    # An odd split of the global batch is refused before any job.
    proc = subprocess.run(
        [str(BIN / "snakemake"), "-n", "--cores", "2", "results/table2.csv", "--config",
         "nlg={finetune: {processes: 3}}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "batch = 8 does not split over processes = 3" in proc.stdout + proc.stderr


def test_a_slurm_run_of_two_nodes_starts_four_ranks_through_srun(tmp_path):
    # The dry run of a Slurm run (the README's profiles) with 2 nodes of 2 processes: the
    # job asks the plugin for the nodes and tasks per node, and its command starts the ranks
    # with srun (tests/test_launch.py checks the words and the sbatch line they make).
    pytest.importorskip("snakemake_executor_plugin_slurm")
    copy_worktree(tmp_path)
    proc = subprocess.run(
        [str(BIN / "snakemake"), "-n", "-p", "--profile", "profiles/slurm-lab-example", "--workflow-profile",
         "profiles/slurm", "runs/quick/table2/gpt2-small/s0/lora/adapter", "--config",
         "nlg={finetune: {processes: 2, nodes: 2}}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = proc.stdout.split("rule nlg_finetune:", 1)[1]
    assert "mpi=srun, nodes=2, tasks_per_node=2, gpu=0" in job.split("Shell command:", 1)[0]
    assert ("srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --cpus-per-task=1 --kill-on-bad-exit=1 "
            f"{sys.executable} stages/nlg_finetune.py") in job
    # On one machine a second node is refused in one line before any job.
    run = subprocess.run(
        [str(BIN / "snakemake"), "--cores", "2", "runs/quick/table2/gpt2-small/s0/lora/adapter", "--config",
         "nlg={finetune: {processes: 2, nodes: 2}}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "nlg.finetune.nodes = 2 needs Slurm" in run.stdout + run.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_gpu_jobs_ask_for_the_gpu_resource(tmp_path):
    # On a GPU profile every device job asks for "gpu" (limit 1 in the workflow profile, which
    # also caps the two-process fine-tuning's request of 2), and every timed job for "timed"
    # (limit 1), so no timed job shares the device or the machine; on CPU none asks for "gpu".
    copy_worktree(tmp_path)
    paper = subprocess.run([str(BIN / "snakemake"), "-n", "--cores", "4", "results/table2.csv", "results/table1.csv",
                            "--config", "profile=paper"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert paper.returncode == 0, paper.stderr[-3000:]
    jobs = paper.stdout.split("rule ")
    finetune = [j for j in jobs if j.startswith("nlg_finetune:")]
    training = [j for j in jobs if j.startswith(("train_online:", "calibrate:", "pretrain_scorer:", "nlg_evaluate:"))]
    assert finetune and all("gpu=1" in j and "timed=1" in j for j in finetune)
    assert training and all("gpu=1" in j for j in training)
    assert all("timed=1" in j for j in training if not j.startswith("nlg_evaluate:"))
    quick = subprocess.run([str(BIN / "snakemake"), "-n", "--cores", "2", "results/table2.csv"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert quick.returncode == 0 and "gpu=1" not in quick.stdout and "gpu=2" not in quick.stdout

