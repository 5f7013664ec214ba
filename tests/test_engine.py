import time

import pytest
import torch

from darel import checkpoint, image_training, schedules
from darel.methods.darel import OnlineSettings
from darel.plans import RunPlan
from darel.schedules import LrSchedule
from darel.augment import DeviceAugment
from darel.models import build_model


class Interrupted(Exception):
    pass


def _problem(n=96, classes=4, size=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    # Class-dependent brightness so the task is learnable.
    images = (torch.rand(n, 1, size, size, generator=gen) * 120 + labels.view(-1, 1, 1, 1) * 30).to(torch.uint8)
    return images, labels


def _plan(**kw):
    base = dict(epochs=4, batch=16, lr_schedule=LrSchedule("multistep", 0.05, milestones=(2, 3), gamma=0.2),
                momentum=0.9, weight_decay=5e-4, seed=3, eval_batch=64,
                selection=OnlineSettings(keep_fraction=0.5, eta=2, warmup_epochs=1, history_size=64, bins=8))
    base.update(kw)
    return RunPlan(**base)


def _run(plan, images, labels, ckpt=None, augment=None, on_epoch_end=None):
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    summary = image_training.train(model, images, labels, augment or aug, aug.normalise, plan, torch.device("cpu"),
                           checkpoint_path=ckpt, progress=False, on_epoch_end=on_epoch_end)
    return model, summary


def test_resume_after_interrupted_epoch_gives_identical_weights(tmp_path):
    images, labels = _problem()
    plan = _plan()
    reference, ref_summary = _run(plan, images, labels)

    ckpt = tmp_path / "ckpt.pt"
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    calls = {"after_epoch_1": 0, "armed": False}

    def arm(epoch, record):
        calls["armed"] = calls["armed"] or epoch == 1

    def failing_augment(x, gen):
        if calls["armed"]:
            calls["after_epoch_1"] += 1
            if calls["after_epoch_1"] == 2:  # dies on the second batch of epoch 2
                raise Interrupted
        return aug(x, gen)

    with pytest.raises(Interrupted):
        _run(plan, images, labels, ckpt=ckpt, augment=failing_augment, on_epoch_end=arm)
    assert ckpt.exists()
    assert checkpoint.loads(ckpt.read_bytes())["loop"]["epoch"] == 2

    resumed, summary = _run(plan, images, labels, ckpt=ckpt)
    assert summary["resumed_from_epoch"] == 2
    assert summary["epochs_completed"] == ref_summary["epochs_completed"] == 4
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert summary["curves"]["train_loss"] == pytest.approx(ref_summary["curves"]["train_loss"], rel=0, abs=0)


def test_checkpoint_of_another_configuration_is_ignored(tmp_path):
    images, labels = _problem()
    ckpt = tmp_path / "ckpt.pt"
    _run(_plan(epochs=2), images, labels, ckpt=ckpt)
    _, summary = _run(_plan(epochs=3), images, labels, ckpt=ckpt)
    assert summary["resumed_from_epoch"] is None
    assert summary["epochs_completed"] == 3


def test_online_epochs_train_full_batches_of_b_and_about_A():
    images, labels = _problem(n=256)
    _, summary = _run(_plan(epochs=5), images, labels)
    trained = summary["curves"]["samples_trained"]
    assert trained[0] == 256  # warm-up epoch: everything
    for count in trained[1:]:
        assert count % 16 == 0  # online epochs: only full batches
    assert 0.3 < sum(trained[1:]) / (4 * 256) < 0.7
    assert summary["curves"]["loss_refreshed"] == [0.0, 1.0, 0.0, 1.0, 0.0]  # eta = 2 after warm-up


def test_time_budget_stops_at_an_epoch_boundary():
    images, labels = _problem()
    _, summary = _run(_plan(epochs=6, time_budget_s=1e-6), images, labels)
    assert summary["stopped_by_budget"] is True
    assert summary["epochs_completed"] == 1
    assert len(summary["curves"]["train_loss"]) == 1


def test_plain_run_has_no_online_selection_and_learns():
    images, labels = _problem()
    model, summary = _run(_plan(epochs=6, selection=None), images, labels)
    assert summary["curves"]["samples_trained"] == [96] * 6
    assert summary["curves"]["train_loss"][-1] < summary["curves"]["train_loss"][0]


def test_rescaled_schedule_compresses_milestones():
    rate = schedules.epochwise("multistep", 0.1, milestones=(60, 120, 160), gamma=0.2, epochs=200, span=100)
    assert rate.kind == "multistep" and rate.milestones == (30, 60, 80)
    assert schedules.epochwise("multistep", 0.1, milestones=(60, 120, 160), gamma=0.2, epochs=200).milestones == \
        (60, 120, 160)
    assert schedules.epochwise("cosine", 0.1, milestones=(), gamma=0.1, epochs=200, span=7).span == 7


# -- measurement on one footing (time, energy, memory) ---------------------------------


def test_plan_enforcement_trains_exactly_the_planned_epochs_and_is_deterministic():
    images, labels = _problem()
    plan = _plan(epochs=6, train_epochs=3)
    first, summary = _run(plan, images, labels)
    second, _ = _run(plan, images, labels)
    assert summary["epochs_completed"] == summary["epochs_planned"] == 3
    assert summary["epochs_protocol"] == 6 and summary["stopped_by_budget"] is False
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="train_epochs"):
        _plan(epochs=6, train_epochs=7)
    with pytest.raises(ValueError, match="exclude"):
        _plan(epochs=6, train_epochs=3, time_budget_s=10.0)


def test_a_subset_is_trained_through_indices_without_a_second_copy():
    import gc
    import warnings

    images, labels = _problem(n=256)
    subset = torch.arange(0, 256, 3)
    big = []

    def count_copies(epoch, record):
        # Every live image tensor (uint8) holding at least a third of the data set, apart
        # from the data itself: a materialised subset would be one.
        gc.collect()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
        for obj in tensors:
            if obj.dtype == torch.uint8 and obj.untyped_storage().nbytes() >= images.nbytes // 3:
                if obj.untyped_storage().data_ptr() != images.untyped_storage().data_ptr():
                    big.append(tuple(obj.shape))

    model, summary = _run(_plan(epochs=3), images, labels, on_epoch_end=count_copies)
    assert big == []
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    summary = image_training.train(model, images, labels, aug, aug.normalise, _plan(epochs=3), torch.device("cpu"),
                           subset=subset, progress=False, on_epoch_end=count_copies)
    assert big == []
    assert summary["curves"]["samples_trained"][0] == len(subset)


def test_memory_peak_covers_scoring_and_evaluation_passes():
    images, labels = _problem(n=256)
    eval_data = _problem(n=200, seed=1)
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    # Training steps of 16 samples, evaluation and scoring in batches of 200: the no-grad
    # passes hold more live activations than a training step, and the cell's peak shows it.
    plan = _plan(epochs=3, eval_batch=200, score_batch=256)
    summary = image_training.train(model, images, labels, aug, aug.normalise, plan, torch.device("cpu"),
                           eval_data=eval_data, progress=False)
    peaks = summary["peak_mem_by_pass"]
    assert set(peaks) == {"train", "eval", "score"}
    assert peaks["score"] > peaks["train"] and peaks["eval"] > peaks["train"]
    assert summary["peak_mem_bytes"] == max(peaks.values())


def test_energy_covers_exactly_the_timed_intervals_also_after_a_resume(tmp_path):
    from darel.measure import EnergyTracker

    images, labels = _problem(n=192)
    plan = _plan(epochs=4)
    torch.manual_seed(0)
    tracker = EnergyTracker("USA", measure_power_secs=0.5)
    tracker.start()
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    started = time.perf_counter()
    summary = image_training.train(model, images, labels, aug, aug.normalise, plan, torch.device("cpu"),
                           energy=tracker, eval_data=_problem(n=64, seed=2), progress=False)
    wall_s = time.perf_counter() - started
    energy = summary["energy"]
    assert energy["timed_intervals"] == 4 and energy["segments"] == 1
    # Each interval's two readings bracket it (a reading's own measurement lies outside the
    # clock), and no more than the call: a busy machine cannot break either side.
    assert summary["time_s"] <= energy["duration_s"] <= wall_s
    assert energy["energy_kwh"] > 0 and energy["co2e_kg"] > 0
    assert energy["energy_kwh"] == pytest.approx(
        energy["cpu_energy_kwh"] + energy["ram_energy_kwh"] + energy["gpu_energy_kwh"], rel=1e-6)

    # Killed after two epochs, then resumed: time and energy are the whole run's.
    ckpt = tmp_path / "ckpt.pt"

    def die_after_epoch_1(epoch, record):
        if epoch == 1:
            raise Interrupted

    tracker = EnergyTracker("USA", measure_power_secs=0.5)
    tracker.start()
    started = time.perf_counter()
    with pytest.raises(Interrupted):
        _run_tracked(plan, images, labels, ckpt, tracker, die_after_epoch_1)
    wall_s = time.perf_counter() - started
    tracker.stop()
    tracker = EnergyTracker("USA", measure_power_secs=0.5)
    tracker.start()
    started = time.perf_counter()
    resumed = _run_tracked(plan, images, labels, ckpt, tracker, None)
    wall_s += time.perf_counter() - started
    assert resumed["resumed_from_epoch"] == 2
    assert resumed["energy"]["timed_intervals"] == 4 and resumed["energy"]["segments"] == 2
    assert "whole run" in resumed["energy"]["energy_covers"]
    assert resumed["time_s"] <= resumed["energy"]["duration_s"] <= wall_s
    assert resumed["time_s"] == pytest.approx(sum(resumed["curves"]["epoch_time_s"]), rel=1e-9)


def _run_tracked(plan, images, labels, ckpt, tracker, on_epoch_end):
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    return image_training.train(model, images, labels, aug, aug.normalise, plan, torch.device("cpu"), energy=tracker,
                        checkpoint_path=ckpt, progress=False, on_epoch_end=on_epoch_end)


def test_wallclock_prediction_of_an_unseen_epoch_kind_uses_the_cost_model():
    # Seen: warm-up epochs took 2 s where the model predicted 1 s; the first refresh
    # epoch (scoring pass included) is predicted at the same ratio, not as a warm-up epoch.
    assert image_training.predict_epoch_s("refresh", {"warmup": 2.0}, {"warmup": 1.0, "refresh": 3.0}) == 6.0
    assert image_training.predict_epoch_s("reuse", {"warmup": 2.0, "reuse": 0.5}, {"reuse": 0.4}) == 0.5
    assert image_training.predict_epoch_s("refresh", {"warmup": 2.0, "reuse": 0.5}, None) == 2.0


def test_sparse_evaluation_and_checkpoints_still_resume_exactly(tmp_path):
    """eval_every / checkpoint_every (the paper profile's cadence): a run killed after an
    epoch without a checkpoint resumes from the last one and ends identical."""
    images, labels = _problem()
    plan = _plan(epochs=5, eval_every=2, checkpoint_every=2)
    reference, ref_summary = _run(plan, images, labels)
    ckpt = tmp_path / "ckpt.pt"

    def die_after_epoch_3(epoch, record):
        if epoch == 2:  # 0-based: three epochs done, the last checkpoint holds two
            raise Interrupted

    with pytest.raises(Interrupted):
        _run(plan, images, labels, ckpt=ckpt, on_epoch_end=die_after_epoch_3)
    assert checkpoint.loads(ckpt.read_bytes())["loop"]["epoch"] == 2
    resumed, summary = _run(plan, images, labels, ckpt=ckpt)
    assert summary["resumed_from_epoch"] == 2
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    assert ref_summary["curves"]["train_loss"] == summary["curves"]["train_loss"]
    # Test accuracy only every second epoch and after the last one.
    records = []
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    image_training.train(model, images, labels, aug, aug.normalise, plan, torch.device("cpu"), progress=False,
                 eval_data=_problem(n=32, seed=5),
                 on_epoch_end=lambda e, r: records.append(r["test_top1"] is not None))
    assert records == [False, True, False, True, True]


# -- faults: checkpoints are verified, other configurations never resumed -----------------


def _interrupted_run(tmp_path, plan, images, labels, after_epoch=1):
    ckpt = tmp_path / "ckpt.pt"

    def die(epoch, record):
        if epoch == after_epoch:
            raise Interrupted

    with pytest.raises(Interrupted):
        _run(plan, images, labels, ckpt=ckpt, on_epoch_end=die)
    return ckpt


@pytest.mark.parametrize("damage", ["garble", "truncate", "empty"])
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(tmp_path, damage, caplog):
    images, labels = _problem()
    plan = _plan(epochs=4)
    reference, _ = _run(plan, images, labels)
    ckpt = _interrupted_run(tmp_path, plan, images, labels, after_epoch=2)  # newest: 3 epochs, .prev: 2
    data = ckpt.read_bytes()
    if damage == "garble":
        middle = len(data) // 2
        ckpt.write_bytes(data[:middle] + bytes(4096) + data[middle + 4096:])
    elif damage == "truncate":
        ckpt.write_bytes(data[: len(data) // 3])
    else:
        ckpt.write_bytes(b"")
    with caplog.at_level("INFO", logger="darel.image_training"):
        resumed, summary = _run(plan, images, labels, ckpt=ckpt)
    assert summary["resumed_from_epoch"] == 2  # the previous checkpoint
    assert "damaged" in caplog.text and "resuming from ckpt.pt.prev" in caplog.text
    for (name, a), (_, b) in zip(reference.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_configuration_change_after_a_kill_starts_clean(tmp_path, caplog):
    images, labels = _problem()
    ckpt = _interrupted_run(tmp_path, _plan(epochs=4), images, labels)
    changed = _plan(epochs=4, lr_schedule=LrSchedule("multistep", 0.02, milestones=(2, 3), gamma=0.2))
    clean, clean_summary = _run(changed, images, labels)
    with caplog.at_level("INFO", logger="darel.image_training"):
        after, summary = _run(changed, images, labels, ckpt=ckpt)
    assert summary["resumed_from_epoch"] is None
    assert "another configuration" in caplog.text and "starting clean" in caplog.text
    assert (tmp_path / "ckpt.pt.stale").exists()  # kept aside until the outputs are accepted
    for (name, a), (_, b) in zip(clean.state_dict().items(), after.state_dict().items()):
        assert torch.equal(a, b), name
    # The caller's inputs are part of the fingerprint too (e.g. another subset's content hash).
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    other = image_training.train(model, images, labels, aug, aug.normalise, changed, torch.device("cpu"), progress=False,
                         checkpoint_path=ckpt, fingerprint_extra={"subset_sha256": "another"})
    assert other["resumed_from_epoch"] is None


def test_a_finished_run_leaves_its_final_checkpoint_for_a_lost_output(tmp_path):
    images, labels = _problem()
    plan = _plan(epochs=3)
    ckpt = tmp_path / "ckpt.pt"
    first, summary = _run(plan, images, labels, ckpt=ckpt)
    assert checkpoint.loads(ckpt.read_bytes())["loop"]["epoch"] == 3
    again, again_summary = _run(plan, images, labels, ckpt=ckpt)  # outputs lost: rewritten without training
    assert again_summary["resumed_from_epoch"] == 3 and again_summary["steps"] == summary["steps"]
    for (name, a), (_, b) in zip(first.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    checkpoint.discard(ckpt)
    assert list(tmp_path.iterdir()) == []


def test_the_run_counts_its_trained_sample_steps_by_the_datas_groups():
    """Issue 28 item 6: what a method trains on, by category. Every trained sample-step is
    counted once in its row's group (a subset's rows, not its positions), the counts add
    up to the samples trained, and they survive the summary as plain integers."""
    from darel import composition

    images, labels = _problem(n=256)
    category = torch.arange(256) % 4  # four groups, one per class here
    subset = torch.arange(0, 256, 2)  # every second row: groups 0 and 2 only
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=4, in_channels=1, width=4)
    aug = DeviceAugment(pad=1, hflip=True, max_rotation_deg=10, mean=[0.3], std=[0.2])
    summary = image_training.train(model, images, labels, aug, aug.normalise, _plan(epochs=3), torch.device("cpu"),
                                   subset=subset, progress=False, groups={"category": (category, 4)})
    counts = summary["trained_by_group"]["category"]
    assert counts[1] == counts[3] == 0 and counts[0] > 0 and counts[2] > 0
    assert sum(counts) == summary["samples_trained"]
    made = composition.summary(summary["trained_by_group"], {"category": [64, 64, 64, 64]})
    assert made["trained"]["clean"] == counts[0] and made["data_share"]["hard"] == 0.25
    assert abs(sum(made["trained_share"].values()) - 1) < 1e-12
    with pytest.raises(ValueError, match="expected 4 counts"):
        composition.summary({"category": [1, 2]}, {"category": [1, 2, 3, 4]})
