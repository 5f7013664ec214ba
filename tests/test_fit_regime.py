"""The fit profile (issue 50, item 2): a regime where the ResNet18 baseline fits its training
set, its study budgets, and the bench script that measured it (bench/fit_regime_pilot.py)."""

import copy

import pytest
import yaml

from darel import config
from darel.study import last_quarter
from tests.conftest import ROOT, load_script

pilot = load_script("bench/fit_regime_pilot.py", "fit_regime_pilot")


@pytest.fixture()
def params():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_fit_profile_is_valid_and_runs_the_chosen_candidate(params):
    cfg = config.validate(config.merge(params, {"profile": "fit"}))
    size, model = pilot.CANDIDATES[pilot.CHOSEN]
    data = config.dataset_params(cfg)
    assert {key: data[key] for key in size} == size
    assert data["size"] == "fit"
    protocol = config.model_protocol(cfg, "resnet18")
    assert {key: protocol[key] for key in model} == model
    # The benchmark's shares stay the committed ones: DAREL's offline stage and the positive
    # control need its label noise.
    for key in ("label_noise", "near_duplicate", "hard", "rare_classes", "rare_size", "nuisance", "augment"):
        assert data[key] == params["datasets"]["synth"][key], key


def test_fit_schedule_keeps_the_papers_proportions(params):
    cfg = config.merge(params, {"profile": "fit"})
    protocol = config.model_protocol(cfg, "resnet18")
    epochs = protocol["epochs"]
    # milestones 60/120/160 of 200 and omega 10 of 200
    assert [m / epochs for m in protocol["milestones"]] == [0.3, 0.6, 0.8]
    assert protocol["warmup_epochs"] / epochs == 0.05


def test_fit_study_budgets_are_two_of_the_papers_grid(params):
    cfg = config.merge(params, {"profile": "fit"})
    budgets = config.study_budgets(cfg, "resnet18")
    paper = {tuple(b) for b in params["profiles"]["paper"]["table1"]["resnet18"]}
    assert budgets == [(0.8, 0.8), (0.5, 0.8)]
    assert set(budgets) <= paper
    assert all(t < 1 for t, _ in budgets)
    # Table 1 on the fit profile trains only the study's budgets beside its baseline.
    assert [tuple(b) for b in cfg["profiles"]["fit"]["table1"]["resnet18"]] == budgets


def test_the_fit_size_changes_no_other_profiles_data(params):
    without = copy.deepcopy(params)
    del without["datasets"]["synth"]["sizes"]["fit"]
    del without["profiles"]["fit"]
    del without["study"]["table1"]["budgets"]["fit"]
    for profile in ("quick", "gpu"):
        assert (config.dataset_params(config.merge(params, {"profile": profile}))
                == config.dataset_params(config.merge(without, {"profile": profile})))
        assert (config.training_params(config.merge(params, {"profile": profile}), "resnet18", 0)
                == config.training_params(config.merge(without, {"profile": profile}), "resnet18", 0))


def test_candidate_config_builds_each_candidate_under_its_own_size():
    for name, (size, model) in pilot.CANDIDATES.items():
        cfg = pilot.candidate_config(name, history_size=120)
        data = config.dataset_params(cfg)
        assert data["size"] == pilot.SIZE and {key: data[key] for key in size} == size, name
        protocol = config.model_protocol(cfg, "resnet18")
        assert {key: protocol[key] for key in model} == model, name
        assert cfg["darel"]["history_size"] == 120


@pytest.mark.parametrize("curve, expected", [
    # 8 epochs: the last quarter is epochs 7-8
    ([0, 0, 0, 0, 0, 0, 10, 12], {"from_epoch": 7, "to_epoch": 8, "points": 2, "range_pp": 2, "rise_pp": 2,
                                  "mean": 11}),
    # a flat quarter with noise around it: the line's rise is zero, the range is not
    ([1, 2, 3, 4, 5, 6, 7, 8, 30, 32, 30, 32, 32, 30], {"from_epoch": 11, "to_epoch": 14, "points": 4,
                                                       "range_pp": 2, "rise_pp": 0.0, "mean": 31}),
    ([5.0], {"from_epoch": 1, "to_epoch": 1, "points": 1, "range_pp": 0, "rise_pp": 0, "mean": 5}),
    # epochs not evaluated (eval_every 2): the line through the evaluated ones, over their epochs
    ([None, 1, None, 2, None, 3, None, 10, None, 12, None, 13], {"from_epoch": 10, "to_epoch": 12, "points": 2,
                                                                 "range_pp": 1, "rise_pp": 1, "mean": 12.5}),
])
def test_last_quarter(curve, expected):
    # the study's verdict (darel.study) and the pilot measure a test curve the same way
    assert pilot.last_quarter is last_quarter
    assert last_quarter(curve) == pytest.approx(expected)


def test_last_quarter_refuses_a_quarter_without_an_evaluated_epoch():
    with pytest.raises(ValueError, match="epochs 4-4"):
        last_quarter([30.0, 31.0, 32.0, None])
    with pytest.raises(ValueError, match="empty"):
        last_quarter([])


def test_study_pilot_params_trains_darel_and_random_at_one_budget_without_controls(params):
    cfg = pilot.study_pilot_params([300, 301], [0.5, 0.8], history_size=120)
    assert cfg["profile"] == "fit" and cfg["study"]["seeds"] == [300, 301]
    table1 = cfg["study"]["table1"]
    assert table1["methods"] == ["darel", "random"] and "validation" not in table1
    assert config.study_budgets(cfg, "resnet18") == [(0.5, 0.8)]
    assert cfg["darel"]["history_size"] == 120
    # Everything else is params.yaml's.
    assert table1["budgets"]["quick"] == params["study"]["table1"]["budgets"]["quick"]
    assert cfg["profiles"] == params["profiles"] and cfg["datasets"] == params["datasets"]
    assert config.validate(cfg) is cfg
