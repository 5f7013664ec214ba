"""How well each Table 1 cell's model fits its own training set, and whether batch-norm statistics explain the gap.

    python bench/train_fit.py                       # the active profile's ResNet18 cells, seed 0
    python bench/train_fit.py --model resnet18_hc --seed 1

For every trained cell under ``runs/<profile>/table1/<model>/s<seed>/``: test top-1 as
the model was saved, top-1 on the whole training set (eval mode, no augmentation), and
test top-1 again after the batch-norm running statistics are recomputed over the whole
training set (a cumulative average, no gradient). A gap between the training loop's own
train top-1 (measured on the batches it trained) and the whole-set figure means the
selection kept away samples the model never learned; if recomputed statistics close the
test gap, the drop came from statistics gathered on a biased selection instead.
Reads the artifacts only; trains nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from darel import config, provenance  # noqa: E402
from darel.evaluation import reestimate_batchnorm  # noqa: E402
from darel.image_training import top1_percent  # noqa: E402
from darel.stagekit.models import load_model, load_split, transforms  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    params = config.load_params(args.params)
    profile = params["profile"]
    prof = params["profiles"][profile]
    torch.set_num_threads(int(prof["threads"]))
    device = torch.device("cpu")
    split = load_split(ROOT / "data" / profile, device)
    dataset = params["datasets"][prof["dataset"]]
    input_size = prof["models"].get(args.model, {}).get("input_size")
    _, normalise = transforms(split["meta"], dataset["augment"], input_size)
    batch = int(prof["eval_batch"])
    folder = ROOT / "runs" / profile / "table1" / args.model / f"s{args.seed}"
    print(f"profile {profile}, {args.model}, seed {args.seed}; top-1 in percent")
    print("| cell | loop's train top-1 (last epoch, trained batches) | whole training set | test | test, BN statistics recomputed |")
    print("|---|---|---|---|---|")
    for cell_dir in sorted(p for p in folder.iterdir() if (p / "model.pt").exists()):
        model, _ = load_model(cell_dir / "model.pt", device)
        model.eval()
        train_record = provenance.read_record(cell_dir / "train.json")
        loop_train = train_record["curves"]["train_top1"][-1]
        whole = top1_percent(model, split["train_x"], split["train_y"], normalise, batch)
        test = top1_percent(model, split["test_x"], split["test_y"], normalise, batch)
        reestimate_batchnorm(model, split["train_x"], normalise, batch)
        test_bn = top1_percent(model, split["test_x"], split["test_y"], normalise, batch)
        print(f"| {cell_dir.name} | {loop_train:.2f} | {whole:.2f} | {test:.2f} | {test_bn:.2f} |")


if __name__ == "__main__":
    main()
