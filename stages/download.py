"""Stage "download": fetch (or generate) the active profile's data set and write it in
the project's one on-disk format (train.npz, test.npz, meta.json)."""

from __future__ import annotations

from darel import data, stagekit


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--out", required=True, help="dataset folder to write")
    ap.add_argument("--raw", default="data/raw", help="cache folder for downloaded archives")
    args = ap.parse_args()
    params, log = stagekit.start(args, "download")
    name = params["dataset"]
    if name == "digits":
        train, test, meta = data.make_digits(image_size=params["image_size"], test_fraction=params["test_fraction"],
                                             seed=params["seed"])
    elif name == "cifar100":
        archive = Path(args.raw) / "cifar-100-python.tar.gz"
        data.download_file(data.CIFAR100_URL, archive, data.CIFAR100_MD5, progress=not args.no_progress)
        train, test, meta = data.load_cifar100_archive(archive)
    else:
        raise SystemExit(f"download: unknown dataset {name!r}")
    data.write_dataset(args.out, train, test, meta)
    log.info("wrote %s: %d train / %d test images (%s)", args.out, meta["n_train"], meta["n_test"], meta["label"])


if __name__ == "__main__":
    main()
