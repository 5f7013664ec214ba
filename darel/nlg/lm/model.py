"""GPT-2 models for data-to-text: tiny configurations for the quick profile, hub
weights (safetensors only) for the paper profile, LoRA adapters through peft."""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Iterator, Sequence

import torch
from transformers import AutoModelForCausalLM, GPT2Config, PretrainedConfig
from transformers.pytorch_utils import Conv1D

from darel.runtime import seeded


def tiny_gpt2_config(
    vocab_size: int,
    n_positions: int = 128,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 2,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> GPT2Config:
    """A small GPT-2 configuration for the quick profile and tests."""
    for name, value in (("vocab_size", vocab_size), ("n_positions", n_positions), ("n_embd", n_embd),
                        ("n_layer", n_layer), ("n_head", n_head)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        # GPT-2's end-of-text doubles as beginning-of-text.
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def resolve_hub_revision(name: str, revision: str | None = None) -> str | None:
    """The commit hash that a hub model name (at ``revision``: branch, tag or commit;
    None for the default branch) points to now, so that a run can record it and a later
    run can pin it. None for a local folder, or when the hub cannot be reached (the
    loader then reports its own error or falls back to its cache)."""
    if Path(name).is_dir():
        return None
    from huggingface_hub import HfApi

    try:
        return HfApi().model_info(name, revision=revision).sha
    except Exception:  # offline, unknown repo: loading will say what is wrong
        return None


def build_lm(config_or_name: PretrainedConfig | str | os.PathLike, seed: int | None = None,
             revision: str | None = None) -> torch.nn.Module:
    """A causal LM: randomly initialised from a config (``seed`` required: the weights
    are a function of the config and the seed alone), or loaded in float32 from a
    model name / local folder (``from_pretrained``, at ``revision`` for a hub name)."""
    if isinstance(config_or_name, PretrainedConfig):
        if seed is None:
            raise ValueError("a model initialised from a config needs a seed (its initial weights are drawn)")
        # transformers draws the initial weights from torch's default generator.
        with seeded(seed):
            return AutoModelForCausalLM.from_config(config_or_name)
    if isinstance(config_or_name, os.PathLike):
        config_or_name = os.fspath(config_or_name)
    if isinstance(config_or_name, str) and config_or_name:
        # float32 master weights; half precision comes from autocast during training.
        # safetensors only: a pickled checkpoint (.bin) is never loaded.
        return AutoModelForCausalLM.from_pretrained(config_or_name, dtype=torch.float32, revision=revision,
                                                    use_safetensors=True)
    raise ValueError(f"expected a transformers config or a model name/folder, got {config_or_name!r}")


def load_with_adapter(model_dir: str | os.PathLike, adapter_dir: str | os.PathLike) -> torch.nn.Module:
    """A base model folder plus the LoRA adapter that ``save_pretrained`` wrote for it."""
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise ValueError(f"{adapter_dir}: no adapter_config.json (not a saved LoRA adapter)")
    base = build_lm(model_dir)
    with _without_peft_deprecation_warning():
        return PeftModel.from_pretrained(base, str(adapter_dir))


@contextlib.contextmanager
def _without_peft_deprecation_warning() -> Iterator[None]:
    # peft 0.21 still calls transformers' deprecated is_gradient_checkpointing.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def _model_max_positions(model: torch.nn.Module) -> int | None:
    config = getattr(model, "config", None)
    return getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)


def add_lora(
    model: torch.nn.Module,
    r: int = 4,
    alpha: int = 32,
    dropout: float = 0.1,
    target_modules: Sequence[str] = ("c_attn",),
    seed: int | None = None,
) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (peft) on ``target_modules``; everything else
    is frozen. GPT-2's projections are ``Conv1D`` (weights stored in x out), which peft
    must be told with ``fan_in_fan_out``. peft draws each adapter's A matrix from torch's
    default generator (B starts at zero): with ``seed`` the draw depends on the seed
    alone (darel.runtime.seeded), without it on the generator's current state."""
    from peft import LoraConfig, get_peft_model

    if not isinstance(r, int) or r < 1:
        raise ValueError(f"LoRA rank r must be a positive integer, got {r!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must lie in [0, 1), got {dropout!r}")
    targets = list(target_modules)
    matched = [
        module for name, module in model.named_modules() if any(name.split(".")[-1] == target for target in targets)
    ]
    if not matched:
        raise ValueError(f"no module of the model is named any of target_modules={targets!r}")
    fan_in_fan_out = all(isinstance(module, Conv1D) for module in matched)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        fan_in_fan_out=fan_in_fan_out,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with _without_peft_deprecation_warning(), seeded(seed) if seed is not None else contextlib.nullcontext():
        return get_peft_model(model, config)


def trainable_parameter_names(model: torch.nn.Module) -> list[str]:
    return [name for name, param in model.named_parameters() if param.requires_grad]
