"""oracle-clean: the study's positive control, possible only on data whose label noise is
known (the generated benchmark records every sample's category). It trains like the
``random`` control (the same class counts ceil(alpha * n_c) per given label, each epoch's
samples kept with probability A, the same budget and plan) on a subset drawn only from the
samples whose label is right: it drops exactly the noisy samples a random subset keeps.
Training on wrong labels costs accuracy, so oracle-clean minus random is positive; a study
that cannot see it lacks the power its verdicts claim (darel.study.validation)."""

from __future__ import annotations

import numpy as np

from darel.methods import register
from darel.methods.darel import OnlineMethod
from darel.selection import kept_count

# The generated benchmark's code of a wrong label (darel.synth.CATEGORIES; kept here so
# that declaring the method imports nothing heavier than numpy).
NOISY = 1


def clean_per_class(labels, category, alpha: float, seed: int) -> np.ndarray:
    """Indices (int64, ascending) of ceil(alpha * n_c) random samples of every class c (n_c
    counted by the given labels, as the random control counts), drawn among the class's
    samples whose category is not label-noise (all of them when fewer remain)."""
    from darel.methods.subsets import check_subset_args

    labels, category = check_subset_args(labels, alpha, seed), np.asarray(category)
    if category.shape != labels.shape:
        raise ValueError(f"category must give one code per sample: shape {category.shape} against labels "
                         f"{labels.shape}")
    kept = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        clean = members[category[members] != NOISY]
        rng = np.random.default_rng([int(seed), int(cls), 0x4F52434C])  # independent stream per class
        size = min(kept_count(float(alpha), members.size), clean.size)
        kept.append(rng.choice(clean, size=size, replace=False))
    return np.sort(np.concatenate(kept)).astype(np.int64)


@register
class OracleClean(OnlineMethod):
    name = "oracle-clean"
    subset = "oracle-clean"
    rule = "uniform"
    order = 95
    needs_category = True  # its subset is drawn from the data's recorded label noise

    def build_subset(self, labels, alpha: float, seed: int, *, category=None):
        if category is None:
            raise ValueError("oracle-clean needs the data's per-sample categories (the generated benchmark "
                             "records them); this data set has none, so its label noise is unknown")
        return clean_per_class(labels, category, alpha, seed)
