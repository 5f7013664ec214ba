"""params.yaml is written in the layout DVC keeps: `dvc exp run -S` changes only the value
it sets (DVC loads it with ruamel's round-trip loader and writes it back)."""

import difflib
import shutil

import pytest
import yaml

from darel import config
from tests.conftest import ROOT


def _changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_dvc_load_dump_round_trip_is_the_identity(tmp_path):
    from dvc.utils.serialize import modify_yaml

    path = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", path)
    with modify_yaml(path):
        pass
    assert path.read_text() == (ROOT / "params.yaml").read_text()


@pytest.mark.parametrize("override, expected", [
    ("darel.mode=easy", ["-  mode: hard", "+  mode: easy"]),
    ("profile=paper", ["-profile: quick", "+profile: paper"]),
    ("profiles.quick.models.resnet18.epochs=41", ["-        epochs: 20", "+        epochs: 41"]),
    ("nlg.finetune.lr=0.001", ["-    lr: 2.0e-4", "+    lr: 0.001"]),
    ("profiles.quick.seeds=[0,1]", ["+    - 1"]),
])
def test_dvc_set_param_changes_only_that_value(tmp_path, override, expected):
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    before = (ROOT / "params.yaml").read_text()
    path.write_text(before)
    apply_overrides(str(path), [override])
    changed = _changed_lines(before, path.read_text())
    assert [line.split("#")[0].rstrip() for line in changed] == expected
    config.validate(yaml.safe_load(path.read_text()))
