"""The memory a configuration asks for, against the memory of the machine that reads it.

Each value has its own bound (darel.bounds), but a product of values within their
bounds can still be absurd: a generated data set of a million images at 256 px (393 GB),
a ResNet of width 1024 at batch 65,536 (petabytes of activations). Such a configuration
would pass the schema and fail later, inside a job, with an allocation traceback. Here
each product that sizes memory is estimated from below and refused, in one line naming
the key, when it exceeds this machine's physical memory.

The estimates are floors, not predictions: they count only what cannot be avoided
(stored images, the activations one step must keep for its backward pass, the weights and
their optimiser state), at the smallest element size a profile may use, so a refused
configuration cannot run here, and a configuration that passes may still need more. The
ceiling is this machine's physical memory (os.sysconf), or MEMORY_FALLBACK where the
system does not say; a GPU job is judged by the host's memory as well (a GPU's memory is
not known before a job runs), and a Slurm run by the memory of the machine that submits
it. Pure functions but ``machine_memory``."""

from __future__ import annotations

import math
import os
from typing import Any

from darel.config.errors import ConfigError
from darel.config.slices import model_protocol

MEMORY_FALLBACK = 1 << 40  # 1 TiB: the ceiling where os.sysconf cannot say

# ResNet18 and ResNet18-HC, measured on this code (autograd's saved tensors, 2 images):
# 1,490-2,850 parameters per width^2, and 40-84 saved values per image, channel of the
# first stage and pixel of its feature map. The floors below take about half of each.
PARAMS_PER_WIDTH2 = 1400
SAVED_PER_FIRST_STAGE_VALUE = 16
HALF = 2                  # bytes of a bf16/fp16 value: the smallest any profile computes in
FP32 = 4
OPTIMISER_COPIES = 3      # SGD with momentum: weights, gradients, momentum
ADAM_COPIES = 4           # Adam: weights, gradients and two moments
DIGITS_IMAGES = 1797      # scikit-learn's digits, resized in float32 by darel.data.make_digits
CIFAR100_SIDE, CIFAR100_TRAIN = 32, 50_000
# GPT-2's published shapes (n_embd, n_layer, n_head, n_positions; vocabulary 50,257), for a
# hub model whose profile gives none; a tiny stand-in's vocabulary "auto" is at most 8,192.
GPT2_SHAPES = {"gpt2-small": (768, 12, 12, 1024), "gpt2-medium": (1024, 24, 16, 1024),
               "gpt2-large": (1280, 36, 20, 1024)}
GPT2_VOCAB, AUTO_VOCAB = 50_257, 8192


def machine_memory() -> int:
    """Bytes of physical memory of this machine; MEMORY_FALLBACK where unknown."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return MEMORY_FALLBACK
    return pages * size if pages > 0 and size > 0 else MEMORY_FALLBACK


def size_text(n: float) -> str:
    """Bytes as a short figure: 393.2 GiB, 2.0 PiB."""
    for unit, power in (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20)):
        if n >= 1 << power:
            return f"{n / (1 << power):,.1f} {unit}"
    return f"{n / 1024:,.1f} KiB"


def synth_bytes(size: dict) -> int:
    """The generated data set's uint8 images, train and test (darel.synth.render)."""
    return (size["n_train"] + size["n_test"]) * size["image_size"] ** 2 * 3


def digits_bytes(side: int) -> int:
    """The digits resized in float32 before they become uint8 (darel.data.make_digits)."""
    return DIGITS_IMAGES * side * side * FP32


def data_shape(cfg: dict, prof: dict) -> tuple[int, int]:
    """(images the training holds on its device, their side in pixels) of a profile's data set."""
    dataset = prof["dataset"]
    if dataset == "synth":
        size = cfg["datasets"]["synth"]["sizes"][prof["dataset_size"]]
        return size["n_train"], size["image_size"]
    if dataset == "digits":
        return DIGITS_IMAGES, cfg["datasets"]["digits"].get("image_size", 16)
    return CIFAR100_TRAIN, CIFAR100_SIDE


def image_model_bytes(proto: dict, eval_batch: int, images: int, data_side: int) -> dict[str, int]:
    """Floors of one image model's memory: the training set on the device (uint8), the
    weights with their optimiser state, the activations one training step keeps for its
    backward pass, and one activation of the first stage in an evaluation batch."""
    side = proto.get("input_size", data_side)
    feature = math.ceil(side / 4) if proto.get("stem", "cifar") == "imagenet" else side  # stride-2 conv + pool
    first_stage = proto["width"] * feature * feature
    return {
        "images": images * data_side * data_side * 3,
        "weights": PARAMS_PER_WIDTH2 * proto["width"] ** 2 * FP32 * OPTIMISER_COPIES,
        "step": proto["batch"] * first_stage * SAVED_PER_FIRST_STAGE_VALUE * HALF,
        "evaluation": eval_batch * first_stage * HALF,
    }


def lm_shape(model: str, spec: dict, tokenizer: dict) -> tuple[int, int, int, int | None, int]:
    """(n_embd, n_layer, n_head, n_positions or None, vocabulary) of a profile's language
    model: the stand-in's own shape where the profile gives it, else GPT-2's."""
    embd, layers, heads, positions = GPT2_SHAPES[model]
    own = "n_embd" in spec or "n_layer" in spec
    vocab = tokenizer.get("vocab_size", "auto") if own else GPT2_VOCAB
    return (spec.get("n_embd", embd), spec.get("n_layer", layers), spec.get("n_head", heads),
            spec.get("n_positions", None if own else positions), AUTO_VOCAB if vocab == "auto" else vocab)


def lm_bytes(shape: tuple, batch: int, length: int | None) -> tuple[int, int]:
    """(parameters, activation bytes of one step) of a GPT-2 shape at ``batch`` sequences
    of ``length`` tokens (none known: 0): per layer and token at least 16 * n_embd bytes
    of hidden states and 2 * n_head * length of attention scores, at two bytes a value."""
    embd, layers, heads, positions, vocab = shape
    params = 12 * layers * embd * embd + (vocab + (positions or 0)) * embd
    steps = batch * length * layers * (16 * embd + 2 * heads * length) if length else 0
    return params, steps


def _refuse(where: str, what: str, need: int, have: int) -> None:
    if need > have:
        raise ConfigError(f"params: {where}: {what}: at least {size_text(need)} of memory; this machine has "
                          f"{size_text(have)}")


def _name(key: Any) -> str:
    return ascii(key)[1:-1] if isinstance(key, str) else repr(key)


def check_memory(cfg: dict) -> None:
    """Refuse (ConfigError, one line naming the key) a data set, an image model or a
    language model of any profile whose memory floor exceeds this machine's memory.
    Runs after the schema: every value has its type and range."""
    have = machine_memory()
    for key, size in cfg["datasets"].get("synth", {}).get("sizes", {}).items():
        _refuse(f"datasets.synth.sizes.{_name(key)}", f"{size['n_train'] + size['n_test']:,} images of "
                f"{size['image_size']}x{size['image_size']}x3 bytes (n_train + n_test)", synth_bytes(size), have)
    if "digits" in cfg["datasets"]:
        side = cfg["datasets"]["digits"].get("image_size", 16)
        _refuse(f"datasets.digits.image_size = {side}", f"{DIGITS_IMAGES:,} digits resized to {side}x{side} in "
                "float32", digits_bytes(side), have)
    for name, prof in cfg["profiles"].items():
        images, data_side = data_shape(cfg, prof)
        for model in cfg["protocols"]:
            proto = model_protocol(cfg, model, name)
            parts = image_model_bytes(proto, prof["eval_batch"], images, data_side)
            busiest = "step" if parts["step"] >= parts["evaluation"] else "evaluation"
            batch = f"batch {proto['batch']}" if busiest == "step" else f"eval_batch {prof['eval_batch']}"
            side = proto.get("input_size", data_side)
            _refuse(f"profiles.{_name(name)}.models.{model}",
                    f"{batch} x width {proto['width']} at {side}x{side} px, with {images:,} training images and the "
                    "weights", parts["images"] + parts["weights"] + parts[busiest], have)
        if "nlg" in prof and "nlg" in cfg:
            _check_language_models(cfg, name, prof["nlg"], have)


def _check_language_models(cfg: dict, name: str, nlg: dict, have: int) -> None:
    """A profile's language models: pre-training a stand-in (Adam, every weight trained),
    fine-tuning (LoRA: the weights frozen) at the batch of one process, and beam search
    (the keys and values of every beam)."""
    finetune = {**cfg["nlg"]["finetune"], **nlg.get("finetune", {})}
    decoding = {**cfg["nlg"]["decoding"], **nlg.get("decoding", {})}
    pretrain = nlg.get("pretrain", {})
    for model, spec in nlg.get("models", {}).items():
        shape = lm_shape(model, spec, nlg.get("tokenizer", {}))
        embd, layers, _, positions, vocab = shape
        length = finetune["max_length"] if isinstance(finetune["max_length"], int) else positions
        where = f"profiles.{_name(name)}.nlg.models.{model}"
        per_process = max(1, finetune["batch"] // (finetune["processes"] * finetune.get("nodes", 1)))
        params, steps = lm_bytes(shape, per_process, length)
        _refuse(where, f"{params:,} parameters ({layers} layers of {embd}, vocabulary {vocab:,}) fine-tuned at batch "
                f"{per_process} x {length or 'data-sized'} tokens", params * HALF + steps, have)
        if "hub" not in spec and ("n_embd" in spec or "n_layer" in spec):
            batch = pretrain.get("batch", finetune["batch"])
            _, steps = lm_bytes(shape, batch, positions or length)
            _refuse(where, f"{params:,} parameters pre-trained with Adam at batch {batch}",
                    params * FP32 * ADAM_COPIES + steps, have)
        tokens = (length or 0) + decoding["max_new_tokens"]
        cache = decoding["num_beams"] * tokens * layers * embd * 2 * HALF
        _refuse(where, f"{decoding['num_beams']} beams x {tokens:,} tokens of keys and values ({layers} layers of "
                f"{embd})", params * HALF + cache, have)
