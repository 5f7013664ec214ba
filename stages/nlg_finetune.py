"""Stage "fine-tuning" for Tables 2/3: LoRA on the pretrained GPT-2, on all training
pairs (the LoRA baseline) or on the DAREL offline subset (Algorithm 2 without classes:
the ceil(alpha*n) pairs ranked by the scorer's loss), under the energy tracker
(darel.stagekit.run_finetuning).

Several processes (``finetune.processes`` > 1, the paper's two GPUs; ``finetune.nodes``
nodes of them under Slurm) are started by torchrun on one machine or by srun under Slurm,
which the workflow puts in front of this script (darel.launch); an srun task first turns
Slurm's variables into torch's. Each process joins the group,
takes its share of every global batch, and process 0 alone measures energy, writes the
adapter and train.json."""

from __future__ import annotations

import os
from pathlib import Path

from darel import launch, stagekit


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--model-dir", required=True, help="the pretrained model to adapt")
    ap.add_argument("--losses", help="the scorer's per-sample losses (absent for the LoRA baseline)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--checkpoint", help="per-epoch checkpoint (outside --out-dir, which Snakemake removes when a "
                                         "job fails): an interrupted job resumes from it; the cell-record stage "
                                         "removes it once the workflow has accepted the adapter")
    stagekit.add_tracking_args(ap)
    args = ap.parse_args()
    launch.adopt_slurm_ranks()  # a task that srun started: its rank from Slurm's variables
    main_process = int(os.environ.get("RANK", "0")) == 0
    params, log = stagekit.start(args, "nlg_finetune", writes=Path(args.out_dir).parent if main_process else None)
    stagekit.run_finetuning(params, data_dir=args.data_dir, tokenizer_dir=args.tokenizer_dir,
                            model_dir=args.model_dir, losses=args.losses, out_dir=args.out_dir,
                            checkpoint=args.checkpoint, log=log, progress=not args.no_progress,
                            tracking=stagekit.tracking_target(args))


if __name__ == "__main__":
    main()
