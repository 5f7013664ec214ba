import copy

import pytest
import yaml

from darel import config
from tests.conftest import ROOT


@pytest.fixture()
def params():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_committed_params_are_valid_and_quick(params):
    cfg = config.validate(params)
    assert cfg["profile"] == "quick"
    cells = config.table1_cells(cfg)
    assert cells[0] == ("resnet18", 0, "baseline")
    assert config.seeds(cfg) == [0] and params["profiles"]["paper"]["seeds"] == [0, 1, 2]
    by_model = {m: [c for mm, _, c in cells if mm == m] for m, _, _ in cells}
    assert len(by_model["resnet18"]) == 12  # baseline + the paper's 10 budgets + IDS + ADONIS
    assert by_model["resnet18"][-1] == "ids_adonis"
    assert by_model["resnet18_hc"] == ["baseline", "t1.00_m1.00", "t0.80_m0.80", "t0.70_m0.80"]


@pytest.mark.parametrize(
    "override, needle",
    [
        ({"profiles": {"quick": {"table1": {"resnet18": [[1.5, 1.0]]}}}}, "profiles.quick.table1.resnet18[0][0] = 1.5"),
        ({"profiles": {"quick": {"table1": {"resnet18": [[0.8, 0.0]]}}}}, "profiles.quick.table1.resnet18[0][1] = 0.0"),
        ({"darel": {"alpha_default": 1.2}}, "darel.alpha_default = 1.2"),
        ({"darel": {"alpha_default": 0}}, "darel.alpha_default = 0"),
        ({"darel": {"mode": "medium"}}, "darel.mode = 'medium'"),
        ({"profile": "huge"}, "profile = 'huge'"),
        ({"profiles": {"paper": {"table1": {"vgg": [[1.0, 1.0]]}}}}, "vgg"),
        ({"table1": {"resnet18": [[1.0, 1.0]]}}, "move them to profiles.<profile>.table1"),
        ({"profiles": {"quick": {"dataset": "mnist"}}}, "profiles.quick.dataset = 'mnist'"),
        ({"darel": {"A_min": 0.9}}, "A_min = 0.9"),
        ({"profiles": {"quick": {"models": {"resnet18": {"warmup_epochs": 50}}}}}, "warmup_epochs = 50"),
        ({"profiles": {"quick": {"table1": {"resnet18": [[0.8, 0.8], [0.8, 0.8]]}}}}, "twice"),
    ],
)
def test_bad_values_are_named(params, override, needle):
    with pytest.raises(config.ConfigError) as err:
        config.validate(config.merge(params, override))
    assert needle in str(err.value)


def test_merge_is_recursive_like_snakemake(params):
    merged = config.merge(params, {"profiles": {"quick": {"models": {"resnet18": {"epochs": 3}}}}})
    assert merged["profiles"]["quick"]["models"]["resnet18"]["epochs"] == 3
    assert merged["profiles"]["quick"]["models"]["resnet18"]["width"] == params["profiles"]["quick"]["models"]["resnet18"]["width"]
    assert merged["profiles"]["paper"] == params["profiles"]["paper"]


def test_slices_separate_cells(params):
    """A budget change must only touch the slices of its own cell."""
    cfg = config.validate(params)
    def budget_cells(c):
        return [cell for model, _, cell in config.table1_cells(c) if model == "resnet18" and cell.startswith("t")]

    before = {c: config.online_params(cfg, "resnet18", c) for c in budget_cells(cfg)}
    changed = copy.deepcopy(params)
    changed["profiles"]["quick"]["table1"]["resnet18"][1] = [0.8, 0.75]
    cfg2 = config.validate(changed)
    after = {c: config.online_params(cfg2, "resnet18", c) for c in budget_cells(cfg2)}
    assert set(before) ^ set(after) == {"t0.80_m0.80", "t0.80_m0.75"}
    assert all(before[c] == after[c] for c in set(before) & set(after))
    assert config.training_params(cfg, "resnet18") == config.training_params(cfg2, "resnet18")


def test_cell_ids_round_trip():
    assert config.cell_id(0.8, 0.55) == "t0.80_m0.55"
    assert config.parse_cell("t0.50_m0.70") == (0.5, 0.7)
    with pytest.raises(config.ConfigError):
        config.parse_cell("t0.5_m0.7")


def test_cli_strings_become_numbers_but_codes_stay_strings():
    raw = {"a": "3", "b": ["0.5", "x"], "c": {"d": "true", "e": "NO", "f": "USA"}}
    assert config.coerce_cli_scalars(raw) == {"a": 3, "b": [0.5, "x"], "c": {"d": True, "e": "NO", "f": "USA"}}


@pytest.mark.parametrize("edit, expected", [
    (lambda p: p["darel"].pop("mode"), "params: darel: missing key 'mode'"),
    (lambda p: p["darel"].update(foo=1), "params: darel: unknown key 'foo'"),
    (lambda p: p["profiles"]["quick"]["models"].update(vgg={}), "params: profiles.quick.models: unknown name 'vgg'"),
    (lambda p: p["profiles"]["quick"]["table1"]["resnet18"].append([0.5, 1.5]),
     "params: profiles.quick.table1.resnet18[10][1] = 1.5: must be <= 1"),
    (lambda p: p["profiles"]["quick"].update(seeds="x"), "params: profiles.quick.seeds = 'x': must be of type array"),
])
def test_config_errors_name_key_value_and_rule_in_one_line(params, edit, expected):
    edit(params)
    with pytest.raises(config.ConfigError) as err:
        config.validate(params)
    message = str(err.value)
    assert message.startswith(expected), message
    assert "\n" not in message and len(message) < 300, message  # never a dump of the section


def test_workflow_config_names_an_override_in_one_line():
    with pytest.raises(config.ConfigError) as err:
        config.workflow_config(ROOT / "params.yaml", {"darel": {"mode": "medium"}})
    assert str(err.value) == "params: darel.mode = 'medium': must be one of ['easy', 'hard']"


def test_yaml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "params.yaml"
    text = (ROOT / "params.yaml").read_text().replace("seed: 0 ", "seed: [0 ", 1)
    bad.write_text(text)
    with pytest.raises(config.ConfigError) as err:
        config.read_yaml(bad)
    assert str(err.value).startswith(f"{bad}: YAML syntax error") and "\n" not in str(err.value)
    line = int(str(err.value).split(" line ")[1].split(",")[0])
    assert abs(line - text.splitlines().index(next(ln for ln in text.splitlines() if ln.startswith("seed:"))) - 1) <= 2


def test_milestones_error_says_to_change_them_with_the_epochs(params):
    with pytest.raises(config.ConfigError, match="set milestones with the epochs"):
        config.validate(config.merge(params, {"profiles": {"quick": {"models": {"resnet18": {"epochs": 4}}}}}))


# ---- absurd values: each refused in one short line, before any job (docs/security.md) ------------

NAN, INF = float("nan"), float("inf")
ABSURD = [  # (override, what the line must say)
    ({"protocols": {"resnet18": {"epochs": 1e9}}}, "protocols.resnet18.epochs = 1000000000.0: must be <= 1000"),
    ({"profiles": {"quick": {"table1": {"resnet18": [[1e-9, 0.5]]}}}}, "table1.resnet18[0][0] = 1e-09: must be >= 0.01"),
    ({"profiles": {"quick": {"table1": {"resnet18": [[0.02, 0.5]]}}}}, "the smallest t that trains one epoch is 0.05"),  # 20 epochs
    ({"darel": {"alpha_default": NAN}}, "darel.alpha_default = nan: must be a finite number"),
    ({"profiles": {"quick": {"table1": {"resnet18": [[NAN, NAN]]}}}}, "= nan: must be a finite number"),
    ({"protocols": {"resnet18": {"lr": INF}}}, "protocols.resnet18.lr = inf: must be a finite number"),
    ({"darel": {"history_size": 10**12}}, "darel.history_size = 1000000000000: must be <= 10000000"),
    ({"protocols": {"resnet18": {"width": 10**6}}}, "width = 1000000: must be <= 1024"),
    ({"profiles": {"quick": {"eval_batch": 10**12}}}, "eval_batch = 1000000000000: must be <= 65536"),
    ({"profiles": {"quick": {"threads": 10**6}}}, "threads = 1000000: must be <= 1024"),
    ({"datasets": {"digits": {"image_size": 10**5}}}, "image_size = 100000: must be <= 1024"),
    ({"protocols": {"resnet18_hc": {"input_size": 10**5}}}, "input_size = 100000: must be <= 1024"),
    ({"darel": {"bins": 10**9}}, "darel.bins = 1000000000: must be <= 10000"),
    ({"budget": {"probe_repeats": 10**9}}, "budget.probe_repeats = 1000000000: must be <= 1000"),
    ({"profiles": {"quick": {"seeds": list(range(100_000))}}}, "more than 20,000 values"),
    ({"profiles": {"quick": {"seeds": list(range(101))}}}, "profiles.quick.seeds = [0, 1, 2"),
    ({"profiles": {"quick": {"table1": {"resnet18": [[1.0, 0.01 + i / 1000] for i in range(101)]}}}}, "at most 100 entries"),
    ({"tracking": {"uri": "sqlite:///" + "a" * 10_000_000}}, "(10,000,010 characters): longer than any value"),
    ({"profile": "q" * 10_000_000}, "profile = 'qqqq"),
    ({"nlg": {"decoding": {"num_beams": 10**6}}}, "num_beams = 1000000: must be <= 64"),
]


@pytest.mark.parametrize("override, needle", ABSURD, ids=[str(i) for i in range(len(ABSURD))])
def test_absurd_values_are_refused_in_one_short_line(params, override, needle):
    with pytest.raises(config.ConfigError) as err:
        config.validate(config.merge(params, override))
    line = str(err.value)
    assert needle in line and line.startswith("params: ") and "\n" not in line and len(line) <= 240, line


def test_yaml_nesting_and_aliases_are_bounded_before_the_schema(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("profile: " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(config.ConfigError, match="nested more than 12 levels deep at line 1"):
        config.read_yaml(deep)
    # Aliases are fine (yaml.safe_dump writes them for shared values) until they expand past the bound.
    committed = (ROOT / "params.yaml").read_text()
    params = yaml.safe_load(committed)
    budgets = params["profiles"]["quick"]["table1"]
    budgets["resnet18_hc"] = budgets["resnet18"]
    shared = tmp_path / "shared.yaml"
    shared.write_text(yaml.safe_dump(params))
    assert "*id001" in shared.read_text()
    cfg = config.load_params(shared)
    assert cfg["profiles"]["quick"]["table1"]["resnet18_hc"] is cfg["profiles"]["quick"]["table1"]["resnet18"]
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(committed + "x:\n  a: &a [x, x, x, x, x, x, x, x, x]\n  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                      + "".join(f"  {n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("bcdefgh", "cdefghi")))
    with pytest.raises(config.ConfigError, match="more than 20,000 values once its aliases"):
        config.load_params(laughs)
    # --config: Snakemake has already parsed the aliases into shared values; they are counted, not expanded.
    value = ["x"] * 9
    for _ in range(9):
        value = [value] * 9  # 9**10 leaves once expanded
    with pytest.raises(config.ConfigError, match="more than 20,000 values once its aliases"):
        config.workflow_config(ROOT / "params.yaml", {"controls": value})
    with pytest.raises(config.ConfigError, match="darel.alpha_default = nan: must be a finite number"):
        config.workflow_config(ROOT / "params.yaml", {"darel": {"alpha_default": "nan"}})


def test_finetune_nodes_split_the_global_batch_and_only_a_second_node_enters_the_slice():
    with pytest.raises(config.ConfigError, match=r"batch = 8 does not split over processes = 1 x nodes = 3"):
        config.load_params(ROOT / "params.yaml", {"nlg": {"finetune": {"nodes": 3}}})
    one = config.load_params(ROOT / "params.yaml")
    two = config.load_params(ROOT / "params.yaml", {"nlg": {"finetune": {"nodes": 2}}})
    # One node (the default) leaves the slices of the runs built before the key as they were.
    assert "nodes" not in config.nlg_finetune_params(one, "table2", "gpt2-small", "lora")["finetune"]
    assert config.nlg_finetune_params(two, "table2", "gpt2-small", "lora")["finetune"]["nodes"] == 2
