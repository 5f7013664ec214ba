"""The generated image benchmark ``synth``: class-structured images with known per-sample
categories (docs/data_card_synth.md). Pure functions: parameters and a seed in, arrays out.

Every class has a prototype: a smooth colour field shared by its group of classes, one
pattern shared by the group and ``own_atoms`` patterns of its own. A pattern ("atom") is
an oriented grating under a Gaussian window plus a colour blob. A sample renders its
prototype through a per-sample nuisance (shift, scale, rotation, phase and orientation
jitter, contrast and brightness), adds background clutter (atoms of random parameters)
and pixel noise. The training set then holds four kinds of samples, each a known share:

* clean: rendered from its class's prototype, labelled with its class;
* label-noise: rendered like a clean sample, labelled with another class drawn uniformly;
* near-duplicate: a copy of a clean training sample of its class plus faint pixel noise;
* hard: a mixture of its class's prototype (weight 0.55-0.7) and another class's (the rest,
  of the same group where the group has several classes), labelled with the majority.

These four are exclusive: a sample has exactly one of them (``category``). The long tail is
a property of classes, not of samples: a share of the classes ("rare") has fewer training
samples, and every sample of such a class has ``rare`` set, whatever its category. The test
set is clean and balanced.

Everything is drawn from numpy generators seeded by (seed, purpose), so the prototypes do
not change when a share or a size changes, and the same parameters give the same bytes.
"""

from __future__ import annotations

import math

import numpy as np

CATEGORIES = ("clean", "label-noise", "near-duplicate", "hard")
CLEAN, NOISY, DUPLICATE, HARD = range(len(CATEGORIES))
# The optional per-sample columns of a generated training split, beside images and labels.
COLUMNS = {"category": np.uint8, "rare": np.bool_, "true_labels": np.int64, "duplicate_of": np.int64}

_CHUNK = 2048  # samples rendered at once: bounds the float64 temporaries to a few tens of MiB at 32x32


def _stream(seed: int, purpose: str) -> np.random.Generator:
    tag = int.from_bytes(purpose.encode(), "little") % (2**32)
    return np.random.default_rng(np.random.SeedSequence([int(seed), tag]))


def class_counts(n: int, num_classes: int, rare: np.ndarray, rare_size: float) -> np.ndarray:
    """Samples per class: a rare class gets ``rare_size`` times a common class's count
    (rounded), the common classes share the rest as evenly as possible; the sum is ``n``."""
    weights = np.where(rare, rare_size, 1.0)
    common = n / weights.sum()
    counts = np.where(rare, np.maximum(1, np.round(rare_size * common)), 0).astype(np.int64)
    left = n - counts.sum()
    n_common = int((~rare).sum())
    counts[~rare] = left // n_common
    counts[np.flatnonzero(~rare)[: left % n_common]] += 1
    return counts


def _atoms(rng: np.random.Generator, shape: tuple[int, ...], frequency: tuple[float, float] = (1.0, 3.0),
           envelope: tuple[float, float] = (0.3, 0.6)) -> dict[str, np.ndarray]:
    """Random atom parameters; coordinates span [-1, 1] over the image, ``frequency`` is the
    range of the gratings' cycles over the image's width, ``envelope`` the range of the
    Gaussian window's standard deviation (in half image widths)."""
    colour = rng.normal(size=shape + (3,))
    colour /= np.linalg.norm(colour, axis=-1, keepdims=True)
    return {
        "centre": rng.uniform(-0.45, 0.45, size=shape + (2,)),
        "sigma": rng.uniform(envelope[0], envelope[1], size=shape),
        "theta": rng.uniform(0.0, math.pi, size=shape),
        "freq": rng.uniform(frequency[0], frequency[1], size=shape),
        "phase": rng.uniform(0.0, 2 * math.pi, size=shape),
        "colour": colour,
        "blob": rng.uniform(-0.6, 0.6, size=shape),      # weight of the plain colour blob beside the grating
    }


def make_prototypes(num_classes: int, classes_per_group: int, own_atoms: int, colour_spread: float,
                    frequency: tuple[float, float], envelope: tuple[float, float], seed: int) -> dict:
    """The class structure: per class its atoms (the group's shared one first) and its
    group's colour field (a base colour and a linear colour gradient). A class's own atoms
    take its group's colour moved by ``colour_spread`` (0: the group's colour exactly), so
    the classes of a group differ mostly in the geometry of their patterns."""
    rng = _stream(seed, "prototypes")
    n_groups = math.ceil(num_classes / classes_per_group)
    group = np.arange(num_classes) // classes_per_group
    shared = _atoms(rng, (n_groups, 1), frequency, envelope)
    own = _atoms(rng, (num_classes, own_atoms), frequency, envelope)
    colour = shared["colour"][group] + colour_spread * own["colour"]
    own["colour"] = colour / np.linalg.norm(colour, axis=-1, keepdims=True)
    atoms = {key: np.concatenate([shared[key][group], own[key]], axis=1) for key in own}
    field_base = rng.normal(scale=0.35, size=(n_groups, 3))
    field_grad = rng.normal(scale=0.25, size=(n_groups, 2, 3))
    return {"atoms": atoms, "group": group, "field_base": field_base[group], "field_grad": field_grad[group]}


def _grid(image_size: int) -> np.ndarray:
    """Pixel centres in [-1, 1], (P, 2) as (x, y)."""
    axis = (np.arange(image_size) + 0.5) / image_size * 2 - 1
    y, x = np.meshgrid(axis, axis, indexing="ij")
    return np.stack([x.ravel(), y.ravel()], axis=1)


def _render_atoms(q: np.ndarray, atoms: dict[str, np.ndarray], weights: np.ndarray) -> np.ndarray:
    """Sum over a sample's atoms at its coordinates ``q`` (B, P, 2); ``atoms`` hold (B, K)
    parameters, ``weights`` (B, K). Returns float32 (B, P, 3)."""
    f32 = np.float32
    ux = q[:, None, :, 0].astype(f32) - atoms["centre"][:, :, None, 0].astype(f32)  # (B, K, P)
    uy = q[:, None, :, 1].astype(f32) - atoms["centre"][:, :, None, 1].astype(f32)
    along = ux * np.cos(atoms["theta"]).astype(f32)[..., None] + uy * np.sin(atoms["theta"]).astype(f32)[..., None]
    along *= (math.pi * atoms["freq"]).astype(f32)[..., None]
    along += atoms["phase"].astype(f32)[..., None]
    wave = np.cos(along, out=along)
    wave += atoms["blob"].astype(f32)[..., None]
    ux *= ux
    uy *= uy
    ux += uy
    ux *= (-0.5 / atoms["sigma"] ** 2).astype(f32)[..., None]
    envelope = np.exp(ux, out=ux)
    wave *= envelope
    wave *= weights.astype(f32)[..., None]
    return np.matmul(wave.transpose(0, 2, 1), atoms["colour"].astype(f32))  # (B, P, K) @ (B, K, 3)


def _take(atoms: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {key: value[rows] for key, value in atoms.items()}


def _prototype_signal(q: np.ndarray, of: np.ndarray, prototypes: dict, jitter: dict) -> np.ndarray:
    """The prototypes of classes ``of`` (B,) at coordinates ``q`` (B, P, 2), their atoms'
    phase and orientation moved by ``jitter`` (B, K): (B, P, 3)."""
    atoms = _take(prototypes["atoms"], of)
    atoms["phase"] = atoms["phase"] + jitter["phase"]
    atoms["theta"] = atoms["theta"] + jitter["theta"]
    field = np.matmul(q.astype(np.float32), prototypes["field_grad"][of].astype(np.float32))
    field += prototypes["field_base"][of][:, None, :].astype(np.float32)
    field += _render_atoms(q, atoms, np.ones(atoms["theta"].shape))
    return field


def _view_draws(rng: np.random.Generator, b: int, k: int, pixels: int, nuisance: dict) -> dict:
    """One chunk's random draws, in the order the chunk has always consumed them: every
    image's bits depend on this order, not on when or where the chunk is painted."""
    draws = {"angle": np.radians(rng.uniform(-nuisance["rotation_deg"], nuisance["rotation_deg"], b)),
             "scale": np.exp(rng.uniform(-nuisance["log_scale"], nuisance["log_scale"], b)),
             "shift": rng.uniform(-nuisance["shift"], nuisance["shift"], (b, 2))}
    draws["jitter"] = {"phase": rng.uniform(-nuisance["phase"], nuisance["phase"], (b, k)),
                       "theta": np.radians(rng.uniform(-nuisance["theta_deg"], nuisance["theta_deg"], (b, k)))}
    draws["clutter"] = _atoms(rng, (b, nuisance["clutter_atoms"]))
    draws["strength"] = rng.uniform(0, nuisance["clutter"], (b, nuisance["clutter_atoms"]))
    draws["contrast"] = rng.uniform(1 - nuisance["contrast"], 1 + nuisance["contrast"], b)[:, None, None]
    draws["brightness"] = rng.uniform(-nuisance["brightness"], nuisance["brightness"], (b, 1, 3))
    draws["noise"] = rng.standard_normal(size=(b, pixels, 3), dtype=np.float32)
    return draws


def _paint(c: np.ndarray, p: np.ndarray, w: np.ndarray, draws: dict, prototypes: dict, grid: np.ndarray,
           image_size: int, noise: float) -> np.ndarray:
    """uint8 (B, H, W, 3) images of one chunk from its draws; no randomness of its own."""
    b = len(c)
    # Per-sample view: rotation, scale and shift of the coordinates (the inverse map).
    cos, sin = np.cos(draws["angle"])[:, None], np.sin(draws["angle"])[:, None]
    moved = grid[None] - draws["shift"][:, None, :]
    q = np.stack([cos * moved[..., 0] + sin * moved[..., 1],
                  -sin * moved[..., 0] + cos * moved[..., 1]], -1) / draws["scale"][:, None, None]
    # Jitter of each atom's phase and orientation, the same for the class's and the partner's atoms.
    jitter = draws["jitter"]
    signal = _prototype_signal(q, c, prototypes, jitter) * w[:, None, None]
    mixed = np.flatnonzero(w < 1)
    if len(mixed):
        part = {key: value[mixed] for key, value in jitter.items()}
        signal[mixed] += _prototype_signal(q[mixed], p[mixed], prototypes, part) * (1 - w[mixed])[:, None, None]
    # Background clutter: atoms of random parameters, each at a random strength, not moved with the object.
    signal += _render_atoms(np.broadcast_to(grid, (b,) + grid.shape), draws["clutter"], draws["strength"])
    pixels = 0.5 + 0.22 * (draws["contrast"] * signal + draws["brightness"]) + draws["noise"] * np.float32(noise)
    return np.clip(np.round(pixels * 255), 0, 255).astype(np.uint8).reshape(b, image_size, image_size, 3)


def render(classes: np.ndarray, partners: np.ndarray, mix: np.ndarray, prototypes: dict, image_size: int,
           nuisance: dict, rng: np.random.Generator, workers: int = 1) -> np.ndarray:
    """uint8 (N, H, W, 3) images: ``mix`` of the class's prototype plus ``1 - mix`` of the
    partner's (mix 1: the class alone), seen through a fresh per-sample nuisance.

    ``workers`` threads paint the chunks (numpy's array work releases the GIL) while this
    thread makes every chunk's draws in order: the same bytes for any number of workers.
    On the gpu profile every GPU job waits for the data set (CIFAR-100's size), so the
    seconds it takes to render are seconds the GPU stands idle (times on one and two
    threads: docs/data_card_synth.md, "Sizes")."""
    workers = max(1, workers)
    n = len(classes)
    grid = _grid(image_size)
    out = np.empty((n, image_size, image_size, 3), dtype=np.uint8)
    k = prototypes["atoms"]["theta"].shape[1]

    def chunk(start: int) -> tuple[slice, tuple]:
        rows = slice(start, min(n, start + _CHUNK))
        draws = _view_draws(rng, rows.stop - rows.start, k, len(grid), nuisance)
        return rows, (classes[rows], partners[rows], mix[rows], draws, prototypes, grid, image_size,
                      nuisance["noise"])

    from concurrent.futures import ThreadPoolExecutor

    pending: list = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, n, _CHUNK):
            rows, job = chunk(start)
            pending.append((rows, pool.submit(_paint, *job)))
            while len(pending) > 2 * workers:  # bounds the draws held in memory
                done_rows, future = pending.pop(0)
                out[done_rows] = future.result()
        for done_rows, future in pending:
            out[done_rows] = future.result()
    return out


NUISANCE_KEYS = ("shift", "log_scale", "rotation_deg", "phase", "theta_deg", "contrast", "brightness", "clutter",
                 "clutter_atoms", "noise")


def _check_settings(num_classes: int, n_train: int, n_test: int, label_noise: float, near_duplicate: float,
                    hard: float, nuisance: dict) -> None:
    """One line naming the first bad setting of make_synth, before anything is drawn."""
    for name, share in (("label_noise", label_noise), ("near_duplicate", near_duplicate), ("hard", hard)):
        if not 0 <= share < 1:
            raise ValueError(f"synth: {name} must lie in [0, 1), got {share!r}")
    if label_noise + near_duplicate + hard >= 1:
        raise ValueError(f"synth: label_noise + near_duplicate + hard = {label_noise + near_duplicate + hard:g} "
                         "leaves no clean sample")
    if num_classes < 2 or n_test < num_classes or n_train < 4 * num_classes:
        raise ValueError(f"synth: need at least 2 classes, one test and four training samples per class; got "
                         f"num_classes={num_classes}, n_train={n_train}, n_test={n_test}")
    missing = [key for key in NUISANCE_KEYS if key not in nuisance]
    if missing:
        raise ValueError(f"synth: nuisance lacks {missing}")


def _copy_near_duplicates(images: np.ndarray, category: np.ndarray, true_labels: np.ndarray, num_classes: int,
                          plan: np.random.Generator) -> np.ndarray:
    """Make each near-duplicate row a copy, with faint noise, of a clean sample of its class
    drawn from ``plan`` (in place, in ``images``; a row whose class has no clean sample stays
    as rendered and becomes clean in ``category``): the row each copies, -1 elsewhere."""
    duplicate_of = np.full(len(true_labels), -1, dtype=np.int64)
    dup_rows = np.flatnonzero(category == DUPLICATE)
    clean_by_class = {c: np.flatnonzero((category == CLEAN) & (true_labels == c)) for c in range(num_classes)}
    for row in dup_rows:
        pool = clean_by_class[int(true_labels[row])]
        if len(pool) == 0:  # a class with no clean sample: keep the row as rendered, and say so
            category[row] = CLEAN
            continue
        duplicate_of[row] = pool[plan.integers(len(pool))]
    copies = np.flatnonzero(duplicate_of >= 0)
    faint = plan.normal(scale=2.0, size=(len(copies),) + images.shape[1:])
    images[copies] = np.clip(np.round(images[duplicate_of[copies]] + faint), 0, 255).astype(np.uint8)
    return duplicate_of


def make_synth(*, num_classes: int, n_train: int, n_test: int, image_size: int, label_noise: float,
               near_duplicate: float, hard: float, rare_classes: float, rare_size: float,
               classes_per_group: int, own_atoms: int, colour_spread: float, frequency: tuple[float, float],
               envelope: tuple[float, float], nuisance: dict, seed: int, workers: int = 1) -> tuple[dict, dict, dict]:
    """(train arrays, test arrays, facts) of the benchmark; the train arrays carry the
    per-sample columns of ``COLUMNS``. ``facts``: the realised counts per category and
    class, the rare classes and the settings, for the data set's meta.json. ``workers``:
    threads that render (``render``); the arrays do not depend on it."""
    _check_settings(num_classes, n_train, n_test, label_noise, near_duplicate, hard, nuisance)
    prototypes = make_prototypes(num_classes, classes_per_group, own_atoms, colour_spread, tuple(frequency),
                                 tuple(envelope), seed)
    plan = _stream(seed, "sample plan")

    n_rare = int(round(rare_classes * num_classes))
    rare = np.zeros(num_classes, dtype=bool)
    rare[plan.choice(num_classes, n_rare, replace=False)] = True
    true_labels = np.repeat(np.arange(num_classes), class_counts(n_train, num_classes, rare, rare_size))
    true_labels = true_labels[plan.permutation(n_train)]

    # Exclusive categories at exact counts, placed at random positions.
    counts = {NOISY: round(label_noise * n_train), DUPLICATE: round(near_duplicate * n_train), HARD: round(hard * n_train)}
    category = np.full(n_train, CLEAN, dtype=np.uint8)
    order = plan.permutation(n_train)
    start = 0
    for code, count in counts.items():
        category[order[start:start + count]] = code
        start += count

    labels = true_labels.copy()
    noisy = np.flatnonzero(category == NOISY)
    offset = plan.integers(1, num_classes, len(noisy))  # another class, uniformly
    labels[noisy] = (true_labels[noisy] + offset) % num_classes

    partners = true_labels.copy()
    mix = np.ones(n_train)
    hard_rows = np.flatnonzero(category == HARD)
    partners[hard_rows] = _partner(true_labels[hard_rows], prototypes["group"], plan)
    mix[hard_rows] = plan.uniform(0.55, 0.7, len(hard_rows))

    images = render(true_labels, partners, mix, prototypes, image_size, nuisance, _stream(seed, "train views"),
                    workers)

    duplicate_of = _copy_near_duplicates(images, category, true_labels, num_classes, plan)

    test_labels = np.repeat(np.arange(num_classes), class_counts(n_test, num_classes, np.zeros(num_classes, bool), 1))
    test_labels = test_labels[_stream(seed, "test plan").permutation(n_test)]
    test_images = render(test_labels, test_labels, np.ones(n_test), prototypes, image_size, nuisance,
                         _stream(seed, "test views"), workers)

    train = {"images": images, "labels": labels.astype(np.int64), "category": category,
             "rare": rare[true_labels], "true_labels": true_labels.astype(np.int64), "duplicate_of": duplicate_of}
    test = {"images": test_images, "labels": test_labels.astype(np.int64)}
    facts = {
        "categories": list(CATEGORIES),
        "category_counts": {name: int((category == code).sum()) for code, name in enumerate(CATEGORIES)},
        "rare_classes": [int(c) for c in np.flatnonzero(rare)],
        "rare_samples": int(rare[true_labels].sum()),
        "train_per_class": np.bincount(true_labels, minlength=num_classes).tolist(),
        "classes_per_group": classes_per_group,
        "own_atoms": own_atoms,
        "colour_spread": colour_spread,
        "frequency": list(frequency),
        "envelope": list(envelope),
        "nuisance": nuisance,
    }
    return train, test, facts


def _partner(classes: np.ndarray, group: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Another class for each of ``classes``: of the same group where it has other members."""
    out = np.empty_like(classes)
    for i, c in enumerate(classes):
        same = np.flatnonzero((group == group[c]) & (np.arange(len(group)) != c))
        pool = same if len(same) else np.flatnonzero(np.arange(len(group)) != c)
        out[i] = pool[rng.integers(len(pool))]
    return out
