"""Stage "download": fetch (or generate) the active profile's data set and write it in
the project's one on-disk format (train.npz, test.npz, meta.json)."""

from __future__ import annotations

from darel import data, stagekit


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--out", required=True, help="dataset folder to write")
    ap.add_argument("--raw", default="data/raw", help="cache folder for downloaded archives")
    ap.add_argument("--workers", type=int, default=1,
                    help="threads that render a generated data set (the same bytes for any number)")
    args = ap.parse_args()
    if args.workers < 1:
        ap.error(f"--workers must be at least 1, got {args.workers}")
    params, log = stagekit.start(args, "download")
    try:
        train, test, meta = data.build_dataset(params, args.raw, progress=not args.no_progress,
                                               workers=args.workers)
    except data.DataUnavailable as err:
        stagekit.fail(log, f"download: {err}")
    data.write_dataset(args.out, train, test, meta)
    log.info("wrote %s: %d train / %d test images (%s)", args.out, meta["n_train"], meta["n_test"], meta["label"])


if __name__ == "__main__":
    main()
