"""The finite range of every parameter (docs/security.md, "Bounded parameters"): the
largest values, sized to what this machine and the paper's protocols can mean, and the
JSON-schema pieces built from them. No imports, so the method declarations
(darel.methods) and the config schema share them."""

MAX_EPOCHS = 1000          # the paper trains 200
MAX_BATCH = 65536          # samples per step, training or evaluation
MAX_THREADS = 1024
MAX_IMAGE_SIDE = 1024      # image_size, input_size (the paper resizes to 224)
MAX_WIDTH = 1024           # channels of the first stage (the paper: 64)
MAX_HISTORY = 10_000_000   # losses in a ring buffer (80 MB of float64)
MAX_BINS = 10_000
MAX_PROBES = 1000          # probe warm-up steps and repeats; rounds at most 100
MAX_LIST = 100             # seeds, budgets, alphas, milestones per list
MAX_SEED = 2**32 - 1
MAX_STEPS = 10_000_000     # warm-up steps, data set rows
MAX_TEXT = 256             # hub names, revisions
MAX_URI = 2048


def int_range(low: int, high: int) -> dict:
    return {"type": "integer", "minimum": low, "maximum": high}


def num_range(low: float, high: float, exclusive_low: bool = False) -> dict:
    return {"type": "number", ("exclusiveMinimum" if exclusive_low else "minimum"): low, "maximum": high}
