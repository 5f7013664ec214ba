"""Stage "calibration": Algorithm 1 (batch size for the memory budget, from measured
training steps) and equations 2-5 (alpha, A, eta for the time budget), from the
baseline's measured wall time T and peak memory M. Writes every input and output."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from darel import budget, engine, io, stagekit  # noqa: E402
from darel.measure import measure_training_step  # noqa: E402


def main() -> None:
    ap = stagekit.parser(__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--baseline", required=True, help="baseline train.json (gives T and M)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    params, log = stagekit.start(args, "calibrate")
    base = io.read_json(args.baseline)
    protocol = params["protocol"]
    device = engine.resolve_device(params["device"])
    engine.configure_runtime(device, params["threads"])
    split = stagekit.load_split(args.data, device)
    augment, _ = stagekit.transforms(split["meta"], params["augment"], protocol.get("input_size"))
    spec = stagekit.model_spec(params["model"], split["meta"], protocol)
    model = stagekit.new_model(spec, params["seed"]).to(device)
    if device.type == "cuda":
        model.to(memory_format=torch.channels_last)
    plan = engine.RunPlan(epochs=protocol["epochs"], batch=protocol["batch"], lr=protocol["lr"],
                          momentum=protocol["momentum"], weight_decay=protocol["weight_decay"],
                          schedule=protocol["schedule"], milestones=tuple(protocol["milestones"]),
                          lr_gamma=protocol["lr_gamma"], seed=params["seed"])
    optimizer = engine.make_optimizer(model, plan)
    gen = engine.epoch_generator(params["seed"], 0, 7, device)
    n = len(split["train_y"])

    def make_batch(b: int):
        idx = torch.randint(0, n, (b,), generator=gen, device=device)
        return augment(split["train_x"][idx], gen), split["train_y"][idx]

    def measure(b: int) -> tuple[float, int]:
        step_s, peak = measure_training_step(model, optimizer, F.cross_entropy, make_batch, b, device,
                                             warmup=params["probe_warmup"], repeats=params["probe_repeats"],
                                             amp=params["amp"])
        log.info("probe b=%d: %.4f s/step, %.1f MiB", b, step_s, peak / 2**20)
        return step_s, peak

    result = budget.calibrate(measure, T_full_s=base["time_s"], M_full_bytes=base["peak_mem_bytes"],
                              t=params["t"], m=params["m"], n_samples=n, epochs=protocol["epochs"],
                              max_batch=protocol["batch"], alpha_default=params["alpha_default"],
                              A_min=params["A_min"], A_max=params["A_max"])
    result["memory_source"] = base.get("memory_source")
    io.write_json(args.out, result)
    log.info("calibration: batch %d, alpha %.3f, A %.3f, eta %d, T_new %.1f s (T %.1f s, t_max %.1f s)",
             result["batch"], result["alpha"], result["A"], result["eta"], result["T_new_s"], result["T_full_s"],
             result["t_max_s"])


if __name__ == "__main__":
    main()
