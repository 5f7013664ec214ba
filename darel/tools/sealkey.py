"""Which seal key this shell would seal and check records with, and its public id:
`python -m darel.tools.sealkey` (docs/security.md, "The seal key"). With `--check FILE...`,
whether each sealed record or archive checks under it (one line each; exit 1 if any fails)."""

from __future__ import annotations

import argparse
import sys

from darel import provenance, sealkey


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", nargs="+", metavar="FILE", help="sealed .json records or .npz archives to check")
    args = ap.parse_args(argv)
    try:
        key_id = sealkey.key_id()
    except sealkey.SealKeyError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"seal key: {sealkey.describe()} (key id {key_id})")
    failed = 0
    for path in args.check or []:
        try:
            (provenance.read_sealed_npz if path.endswith(".npz") else provenance.read_record)(path)
            print(f"{path}: sealed with this key")
        except provenance.ArtifactError as err:
            failed += 1
            print(str(err).split("; ")[0])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
