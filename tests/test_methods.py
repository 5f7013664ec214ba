"""darel.methods: one module per method, found by looking, declared without torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from darel import config, methods
from tests.conftest import ROOT


def test_every_method_is_declared_once_in_listing_order():
    assert methods.names(study=True) == ("darel", "darel-history", "darel-bins", "darel-floor", "random-offline",
                                         "uniform-online", "random", "short-schedule", "selective-backprop",
                                         "infobatch", "rs2", "darel-restream", "oracle-clean")
    assert set(methods.names()) - set(methods.names(study=True)) == {"baseline", "ids+adonis"}
    subsets = {m.name: m.subset for m in methods.all_methods()}
    assert subsets == {"baseline": "full", "darel": "darel", "random-offline": "random", "uniform-online": "darel",
                       "random": "random", "short-schedule": "full", "selective-backprop": "full", "infobatch": "full",
                       "rs2": "full", "ids+adonis": "ids", "darel-restream": "darel", "oracle-clean": "oracle-clean",
                       "darel-history": "darel", "darel-bins": "darel", "darel-floor": "darel"}
    assert {m.name for m in methods.all_methods() if m.uses_scorer} == {"darel", "uniform-online", "ids+adonis",
                                                                         "darel-restream", "darel-history",
                                                                         "darel-bins", "darel-floor"}
    assert list(methods.own_subsets()) == ["random", "oracle-clean"]
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        methods.get("nope")


def test_the_schema_validates_each_methods_settings_from_its_declaration():
    cfg = yaml.safe_load((ROOT / "params.yaml").read_text())
    cfg["controls"]["infobatch"]["r_max"] = 1.5
    with pytest.raises(config.ConfigError, match=r"controls.infobatch.r_max = 1.5: must be < 1"):
        config.validate(cfg)
    cfg = yaml.safe_load((ROOT / "params.yaml").read_text())
    cfg["study"]["table1"]["methods"].append("rs2")
    del cfg["controls"]["rs2"]
    with pytest.raises(config.ConfigError, match="study.table1.methods lists rs2, whose settings are missing"):
        config.validate(cfg)
    cfg = yaml.safe_load((ROOT / "params.yaml").read_text())
    del cfg["darel"]["bins"]
    with pytest.raises(config.ConfigError, match="darel: missing key 'bins'"):
        config.validate(cfg)


_PROBE = """
import json, sys
from darel import config, methods
toy = methods.get("toy")
out = {"names": list(methods.names(study=True)), "subsets": list(methods.own_subsets()),
       "enum": config.SCHEMA["properties"]["study"]["properties"]["table1"]["properties"]["methods"]["items"]["enum"],
       "settings": config.SCHEMA["properties"]["controls"]["properties"]["toy"]["required"]}
import darel.preflight, darel.layout, darel.grammar, darel.plans  # what the workflow imports
out["torch"] = "torch" in sys.modules
print(json.dumps(out))
"""


def test_a_method_folder_dropped_into_the_package_is_found_without_torch(tmp_path):
    """A copy of the package with one more method folder (the workflow test's toy control): the
    registry, the schema's method list and settings find it; declaring methods, as the
    workflow does at every start, imports no torch."""
    shutil.copytree(ROOT / "darel", tmp_path / "darel", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "darel/methods/toy").mkdir()
    shutil.copy(ROOT / "tests/data/toy_method.py", tmp_path / "darel/methods/toy/__init__.py")
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["names"][-1] == "toy" and "toy" in out["enum"] and out["subsets"] == ["random", "oracle-clean", "firsts"]
    assert out["settings"] == ["offset"]
    assert out["torch"] is False
