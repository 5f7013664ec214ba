"""darel.grammar: every value that reaches a path or a shell command is held to a strict
pattern, matched in full and in ASCII; darel.config applies it before any job runs."""

import copy

import pytest
import yaml

from darel import config, grammar
from tests.conftest import ROOT

# Names an attacker (or a typo) might put where a profile name goes.
BAD_NAMES = [
    "q;touch /tmp/x;#",             # shell command separator
    "q$(touch /tmp/x)",             # command substitution
    "q`touch /tmp/x`",              # backticks
    "quick\n",                      # a trailing newline ($ would match before it)
    "quick\nrm -rf ~",              # a second line
    "../../../tmp/evil",            # path traversal
    "..",                           # the parent folder
    ".hidden",                      # a leading dot
    "/tmp/evil",                    # an absolute path
    "a/b",                          # a path separator
    "a\\b",                         # a backslash
    "-rf",                          # an option
    "Quick",                        # upper case
    "qu\u0131ck",                   # dotless i, looks like "quick"
    "\uff51uick",                   # full-width q
    "quick\u200b",                  # a zero-width space
    "\u0669",                       # an Arabic-Indic digit (\d would take it)
    "",                             # empty
    "q" * 65,                       # too long
    "q k",                          # a space
    "q'k",                          # a quote
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_refused_in_one_line(name):
    with pytest.raises(grammar.GrammarError) as err:
        grammar.check_name(name, "profile")
    message = str(err.value)
    assert "\n" not in message and message.startswith("profile = ")


@pytest.mark.parametrize("name", ["quick", "paper", "q1", "my-profile", "a.b_c-d", "0"])
def test_good_names_pass(name):
    assert grammar.check_name(name, "profile") == name


BAD_URIS = [
    "sqlite:///mlflow.db$(touch /tmp/y)",
    "sqlite:///mlflow.db;touch /tmp/y",
    "sqlite:///mlflow.db`id`",
    "sqlite:///mlflow.db\n",
    "sqlite:///mlflow.db && id",
    "sqlite:////tmp/elsewhere.db",      # outside the project
    "sqlite:///../elsewhere.db",        # up and out
    "sqlite:///runs/../../x.db",
    "sqlite:///",
    "sqlite://mlflow.db",
    "file:///tmp/mlruns",
    "http://",
    "http:///path-only",
    "https://host/\u0440ath",           # Cyrillic er, looks like p
    "https://host/a b",
    "postgresql://u:p@host/db?x=1&y=2",  # & is a shell character (use the driver's environment variables)
    "mysql://u@host/db'",
    "",
    None,
    42,
]


@pytest.mark.parametrize("uri", BAD_URIS)
def test_bad_tracking_uris_are_refused_in_one_line(uri):
    with pytest.raises(grammar.GrammarError) as err:
        grammar.check_tracking_uri(uri)
    assert "\n" not in str(err.value) and str(err.value).startswith("tracking.uri = ")


@pytest.mark.parametrize("uri", [
    "sqlite:///mlflow.db", "sqlite:///stores/team.db", "http://127.0.0.1:5000", "https://mlflow.example.org/team",
    "postgresql://mlflow@db.internal:5432/mlflow", "postgresql+psycopg2://u:p%40ss@10.0.0.5/mlflow",
    "mysql+pymysql://mlflow@db/mlflow", "http://[::1]:5000",
])
def test_good_tracking_uris_pass(uri):
    assert grammar.check_tracking_uri(uri) == uri


def test_cell_grammars_are_ascii_and_whole():
    assert grammar.matches(grammar.TABLE1_CELL, "t0.80_m0.55") and grammar.matches(grammar.TABLE1_CELL, "baseline")
    for bad in ("t0.80_m0.55\n", "t\u0660.80_m0.55", "t0.8_m0.55", "../baseline", "baseline/x"):
        assert not grammar.matches(grammar.TABLE1_CELL, bad), bad
    assert grammar.matches(grammar.NLG_CELL, "a0.70_random") and not grammar.matches(grammar.NLG_CELL, "a0.70_x")


@pytest.fixture()
def params():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def _with_profile(params, name):
    edited = copy.deepcopy(params)
    edited["profiles"][name] = edited["profiles"].pop("quick")
    edited["profile"] = name
    return edited


@pytest.mark.parametrize("name", [n for n in BAD_NAMES if isinstance(n, str)])
def test_the_config_refuses_a_bad_profile_name_before_anything_runs(params, name):
    with pytest.raises(config.ConfigError) as err:
        config.validate(_with_profile(params, name))
    assert "\n" not in str(err.value) and "params: profile" in str(err.value)


def test_a_bad_profile_key_is_refused_even_when_not_active(params):
    edited = copy.deepcopy(params)
    edited["profiles"]["../x"] = copy.deepcopy(edited["profiles"]["quick"])
    with pytest.raises(config.ConfigError, match=r"profiles\.\.\./x"):
        config.validate(edited)


@pytest.mark.parametrize("uri", [u for u in BAD_URIS if isinstance(u, str)])
def test_the_config_refuses_a_bad_tracking_uri(params, uri):
    with pytest.raises(config.ConfigError) as err:
        config.validate(config.merge(params, {"tracking": {"uri": uri}}))
    assert "\n" not in str(err.value) and "params: tracking.uri" in str(err.value)


@pytest.mark.parametrize("key, value", [("hub", "gpt2;id"), ("hub", "../../etc"), ("hub", "/abs/path"),
                                        ("revision", "main$(id)"), ("revision", "../x")])
def test_hub_names_and_revisions_are_held_to_their_grammar(params, key, value):
    edited = copy.deepcopy(params)
    edited["profiles"]["paper"]["nlg"]["models"]["gpt2-small"][key] = value
    with pytest.raises(config.ConfigError, match=key):
        config.validate(edited)


@pytest.mark.parametrize("code", ["USA\n", "usa", "US", "U$A"])
def test_the_country_code_is_three_capitals_and_nothing_else(params, code):
    with pytest.raises(config.ConfigError, match="country_iso_code"):
        config.validate(config.merge(params, {"carbon": {"country_iso_code": code}}))
