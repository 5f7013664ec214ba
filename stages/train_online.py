"""Stage "online training": DAREL on the offline subset with Algorithm 3 (keep
fraction A, loss refresh every eta epochs, warm-up epochs) at the calibrated batch
size, stopping at the epoch boundary where the time budget t*T would be exceeded."""

from __future__ import annotations

from darel import io, stagekit
from darel.runs import run_training


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--subset", required=True)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "train_online")
    run_training(params, data_dir=args.data, out_dir=args.out_dir, log=log, progress=not args.no_progress,
                 calibration=io.read_json(args.calibration), subset_indices=io.read_npz(args.subset)["indices"])


if __name__ == "__main__":
    main()
