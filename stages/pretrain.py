"""Stage "pretrain scorer": train the model on the full training set. Its checkpoint is
the offline scorer of Algorithm 2, and the run is the baseline cell of the table
(the T and M of every budget are read from its train.json)."""

from __future__ import annotations

from darel import stagekit
from darel.stagekit import run_training


def main() -> None:
    args = stagekit.image_training_parser(__doc__).parse_args()
    params, log = stagekit.start(args, "pretrain", writes=args.out_dir)
    run_training(params, data_dir=args.data, out_dir=args.out_dir, log=log, progress=not args.no_progress,
                 tracking=stagekit.tracking_target(args), eval_out=args.eval_out)


if __name__ == "__main__":
    main()
