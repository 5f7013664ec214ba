"""The paper's SGD (momentum, weight decay, no dampening, no Nesterov) for the CPU, in plain
tensor operations, outside torch.optim.

Why not torch.optim.SGD on the CPU: building any torch.optim optimizer imports torch's
compiler (torch._dynamo), about 1 s of CPU in every process, and every training, baseline
and calibration of the quick profile is a process of its own (bench/lean_start.py measures
it). ``PlainSGD`` performs the same operations in the same order as torch's per-tensor SGD
(the path torch takes for CPU tensors), so the weights are the same bit for bit
(tests/test_sgd.py trains both side by side), and its ``state_dict`` has torch's layout,
so a checkpoint loads in either. On a GPU ``darel.step.sgd`` keeps torch's fused SGD.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch


class PlainSGD:
    """``param_groups`` (one group: its ``lr`` set by darel.schedules.set_rate), ``state``
    (each parameter's ``momentum_buffer``), ``step``, ``zero_grad``, ``state_dict`` and
    ``load_state_dict``: what the project's training paths use of an optimizer."""

    def __init__(self, params: Iterable[torch.Tensor], *, lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
        params = list(params)
        if not params:
            raise ValueError("PlainSGD got an empty parameter list")
        self.param_groups: list[dict[str, Any]] = [{
            "params": params, "lr": lr, "momentum": momentum, "dampening": 0, "weight_decay": weight_decay,
            "nesterov": False, "maximize": False}]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad
                if weight_decay != 0:
                    grad = grad.add(param, alpha=weight_decay)
                if momentum != 0:
                    state = self.state.setdefault(param, {})
                    buffer = state.get("momentum_buffer")
                    if buffer is None:
                        buffer = state["momentum_buffer"] = grad.detach().clone()
                    else:
                        buffer.mul_(momentum).add_(grad, alpha=1)
                    grad = buffer
                param.add_(grad, alpha=-lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if set_to_none:
                    param.grad = None
                else:  # as torch.optim does: a gradient that is a view (e.g. a DDP bucket's) stays one
                    if param.grad.grad_fn is not None:
                        param.grad.detach_()
                    else:
                        param.grad.requires_grad_(False)
                    param.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout (parameters by their index over the groups), without torch's
        implementation flags (foreach, fused, differentiable), which a torch optimizer that
        loads it sets to its defaults."""
        index = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for param in group["params"]:
                index.setdefault(id(param), len(index))
                ids.append(index[id(param)])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        state = {index[id(param)]: dict(value) for param, value in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(saved["params"]) != len(own["params"]) for saved, own in zip(groups, self.param_groups)):
            raise ValueError("the saved optimizer state does not match this optimizer's parameter groups")
        by_index = {}
        for saved, own in zip(groups, self.param_groups):
            by_index.update(zip(saved["params"], own["params"]))
            for key in ("lr", "momentum", "weight_decay"):
                own[key] = saved[key]
        # Copies, as torch.optim's load makes none only where the values already fit: the
        # buffers are updated in place, and must not write into the caller's dict.
        self.state = {by_index[k]: {name: value.detach().to(by_index[k].device, by_index[k].dtype).clone()
                                    for name, value in entry.items()}
                      for k, entry in state_dict["state"].items()}


# What the project's training paths take as an optimizer: torch's, or this one on a CPU.
Optimizer = torch.optim.Optimizer | PlainSGD
