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
    # SQLite URI filenames and query parameters: ?uri=true opens file: names anywhere (issue 48)
    "sqlite:///file:/elsewhere/x.db?uri=true",
    "sqlite:///file:x.db?uri=true",
    "sqlite:///x.db?uri=1",
    "sqlite:///x.db?mode=rwc",
    "sqlite:///x.db?vfs=unix-dotfile",
    "sqlite:///x.db?",
    "sqlite:///file:x.db",
    "sqlite:///:memory:",
    "sqlite:///a%2F..%2F..%2Fx.db",
    "sqlite:///.hidden.db",
    "sqlite:///runs/./x.db",
    "sqlite:///runs//x.db",
    "sqlite:///x@y.db",
    "sqlite:////elsewhere/x.db?uri=true",
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
    "postgresql://mlflow@db.internal:5432/mlflow", "postgresql+psycopg2://u@10.0.0.5/mlflow",
    "mysql+pymysql://mlflow@db/mlflow", "http://[::1]:5000",
])
def test_good_tracking_uris_pass(uri):
    assert grammar.check_tracking_uri(uri) == uri


# A password anywhere in the URI (issue 48): Snakemake prints its command line (--config) in
# its banner and its log, so the URI is refused in one line that hides the password and says
# where the password goes instead.
PASSWORD_URIS = [
    ("postgresql://u:MARKERpw@db/mlflow", "PGPASSWORD or ~/.pgpass"),
    ("postgresql+psycopg2://u:MARK%40ERpw@10.0.0.5/mlflow", "PGPASSWORD"),
    ("postgresql://u:MARKER/pw@db/mlflow", "PGPASSWORD"),          # a '/' in the password
    ("postgresql://u:MARKER?pw@db/mlflow", "PGPASSWORD"),          # a '?' in the password
    ("postgresql://u:MARKER@pw@db/mlflow", "PGPASSWORD"),          # an '@' in the password
    ("postgresql://u@db/mlflow?password=MARKERpw", "PGPASSWORD"),  # libpq reads it from the query
    ("postgresql://u@db/mlflow?pass%77ord=MARKERpw", "PGPASSWORD"),  # SQLAlchemy unquotes the key
    ("postgresql://u@db/mlflow?sslpassword=MARKERpw", "PGPASSWORD"),
    ("mysql+pymysql://u:MARKERpw@db:3306/mlflow", "read_default_file"),
    ("mysql://u@db/mlflow?passwd=MARKERpw", "read_default_file"),
    ("https://u:MARKERpw@mlflow.example.org", "MLFLOW_TRACKING_USERNAME/PASSWORD"),
    ("http://127.0.0.1:5000/?token=MARKERpw", "MLFLOW_TRACKING_USERNAME/PASSWORD"),
    ("postgresql://u:MARKER pw@db/mlflow;id", "PGPASSWORD"),       # refused for the password first, hidden
    ("postgresql://u:@db/mlflow", "PGPASSWORD"),                    # an empty password is still one
]


@pytest.mark.parametrize("uri, hint", PASSWORD_URIS)
def test_a_password_in_the_uri_is_refused_without_echoing_it(uri, hint):
    with pytest.raises(grammar.GrammarError) as err:
        grammar.check_tracking_uri(uri)
    line = str(err.value)
    assert line.startswith("tracking.uri = ") and "\n" not in line and len(line) <= 240, line
    assert "password" in line and hint in line, line
    assert "MARK" not in line and "pw@" not in line and "%40ER" not in line, line


def test_a_user_without_a_password_stays_allowed():
    for uri in ("postgresql://mlflow@db:5432/mlflow", "mysql+pymysql://u@db/mlflow", "http://u@[::1]:5000",
                "postgresql://mlflow@:5433/mlflow?host=/run/postgresql"):
        assert grammar.check_tracking_uri(uri) == uri and not grammar.password_in(uri)
    assert grammar.masked("postgresql://u:s3cr/et@db/x?password=s3") == "postgresql://u:***@db/x?password=***"


@pytest.mark.parametrize("uri", [u for u, _ in PASSWORD_URIS])
def test_the_config_refuses_a_password_in_the_tracking_uri(params, uri):
    for edit in ({"tracking": {"uri": uri}},):
        with pytest.raises(config.ConfigError) as err:
            config.validate(config.merge(params, edit))
        assert str(err.value).startswith("params: tracking.uri = ") and "MARK" not in str(err.value)
    with pytest.raises(config.ConfigError) as err:  # the same as a --config override
        config.workflow_config(ROOT / "params.yaml", {"tracking": {"uri": uri}})
    assert str(err.value).startswith("params: tracking.uri = ") and "MARK" not in str(err.value)


def _store_project(tmp_path):
    project, outside = tmp_path / "project", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    return project, outside


@pytest.mark.parametrize("layout", ["folder link", "file link", "dangling file link", "journal link", "lock link",
                                    "link chain", "link loop"])
def test_a_sqlite_store_led_out_of_the_project_by_a_link_is_refused(tmp_path, layout):
    project, outside = _store_project(tmp_path)
    uri = "sqlite:///stores/m.db"
    (project / "stores").mkdir()
    if layout == "folder link":
        (project / "stores").rmdir()
        (project / "stores").symlink_to(outside)
    elif layout == "file link":
        (outside / "m.db").write_bytes(b"victim")
        (project / "stores/m.db").symlink_to(outside / "m.db")
    elif layout == "dangling file link":
        (project / "stores/m.db").symlink_to(outside / "new.db")
    elif layout == "journal link":
        (project / "stores/m.db-journal").symlink_to(outside / "journal")
    elif layout == "lock link":
        (project / "stores/m.db.lock").symlink_to(outside / "lock")
    elif layout == "link chain":  # inside, then out
        (project / "stores/inner").symlink_to(outside)
        (project / "stores/m.db").symlink_to(project / "stores/inner/m.db")
    else:
        (project / "stores/m.db").symlink_to(project / "stores/m.db")
    with pytest.raises(grammar.GrammarError) as err:
        grammar.check_store_inside(uri, project)
    assert str(err.value).startswith("tracking.uri = 'sqlite:///stores/m.db'") and "\n" not in str(err.value)
    assert sorted(p.name for p in outside.iterdir()) == (["m.db"] if layout == "file link" else [])


def test_a_sqlite_store_inside_the_project_passes_links_and_all(tmp_path):
    project, _ = _store_project(tmp_path)
    (project / "real").mkdir()
    (project / "stores").symlink_to(project / "real")  # a link that stays inside
    grammar.check_store_inside("sqlite:///stores/m.db", project)
    grammar.check_store_inside("sqlite:///mlflow.db", project)
    grammar.check_store_inside("postgresql://u@db/mlflow", project)  # not a file: nothing to judge


def test_the_config_judges_the_store_from_the_project_folder(params, tmp_path, monkeypatch):
    project, outside = _store_project(tmp_path)
    (project / "mlflow.db").symlink_to(outside / "mlflow.db")
    monkeypatch.chdir(project)
    with pytest.raises(config.ConfigError) as err:
        config.validate(params)
    assert str(err.value).startswith("params: tracking.uri = 'sqlite:///mlflow.db': mlflow.db leads out of the "
                                     "project"), str(err.value)
    assert list(outside.iterdir()) == []


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
