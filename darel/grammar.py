"""The grammar of every value that becomes part of a path or a shell command.

Profile, model, data set, cell and method names end up in folder names and on stage
command lines; the MLflow tracking URI ends up on command lines and in connection
strings. Each is held here to a strict pattern before any job runs, so that a
params.yaml, a ``--config`` override or a file from someone else can neither inject a
shell command nor write outside the project. The workflow quotes them as well; the
patterns are the first line of defence, the quoting the second.

Patterns are matched in full (``re.fullmatch``, ASCII only): ``$`` would accept a
trailing newline, and ``\\d`` or ``\\w`` would accept look-alike digits and letters
from other scripts.

The cell-id patterns are the single definition of the workflow's wildcards: the
Snakemake rules take their wildcard constraints from here.
"""

from __future__ import annotations

import re
from pathlib import Path

# The first word of the label of data made on the machine (every output carries the label).
GENERATED_DATA = "GENERATED"

# A name that is one path component: lower-case ASCII letters, digits, '_', '.', '-';
# never empty, never starting with a dot (no '.', '..', hidden files) or a dash (no option).
NAME = r"[a-z0-9][a-z0-9_.-]*"
NAME_MAX = 64

# Cells of Table 1: the baseline, a budget t<t>_m<m> (two decimals), the IDS + ADONIS row.
_FRACTION = r"[0-9]\.[0-9]{2}"  # a budget or alpha in a cell id: two decimals
BUDGET_CELL = rf"t{_FRACTION}_m{_FRACTION}"
TABLE1_BASELINE = "baseline"
IDS_ADONIS = "ids_adonis"
TABLE1_CELL = rf"{TABLE1_BASELINE}|{IDS_ADONIS}|{BUDGET_CELL}"
# Cells of Tables 2/3: the LoRA baseline, an alpha a<alpha>, its study controls (suffixed by method).
NLG_BASELINE = "lora"
ALPHA_CELL = rf"a{_FRACTION}"
NLG_CONTROL_SUFFIX = {"random": "_random", "easy": "_easy"}
NLG_CELL = rf"{NLG_BASELINE}|{ALPHA_CELL}(?:{'|'.join(NLG_CONTROL_SUFFIX.values())})?"
SEED = r"[0-9]+"
# A Hugging Face hub name (``gpt2``, ``org/name``) and a revision (branch, tag or commit).
HUB_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*(?:/[A-Za-z0-9][A-Za-z0-9_.-]*)?"
REVISION = r"[A-Za-z0-9][A-Za-z0-9_.-]*(?:/[A-Za-z0-9][A-Za-z0-9_.-]*)*"

# MLflow stores the workflow accepts, and the characters a URI may hold: no whitespace,
# no shell metacharacters (; & | $ ` ' " < > ( ) { } * ! # ~ \), ASCII only.
TRACKING_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg2", "postgresql+psycopg", "mysql", "mysql+pymysql",
                    "http", "https")
_URI_BODY = r"[A-Za-z0-9._:/?=%@+,\[\]-]+"
_URI = re.compile(rf"(?P<scheme>[a-z0-9+]+)://(?P<rest>{_URI_BODY})", re.ASCII)


def cell_id(t: float, m: float) -> str:
    """The cell id of budget B(t, m): t0.80_m0.55."""
    return f"t{t:.2f}_m{m:.2f}"


def budget_of_cell(cell: str) -> tuple[float, float] | None:
    """(t, m) of a budget cell id, None for any other string."""
    match = re.fullmatch(rf"t({_FRACTION})_m({_FRACTION})", cell, flags=re.ASCII) if isinstance(cell, str) else None
    return (float(match.group(1)), float(match.group(2))) if match else None


def alpha_cell(alpha: float) -> str:
    """The cell id of a Table 2/3 alpha: a0.80."""
    return f"a{alpha:.2f}"


class GrammarError(ValueError):
    """A value that would reach a path or a shell command and breaks its pattern."""


SHOWN_MAX = 60  # characters of a refused value echoed in its one-line message


def shown(value: object, limit: int = SHOWN_MAX) -> str:
    """A value as a refusal line echoes it: ASCII-escaped, at most ``limit`` characters
    (a longer one cut, with its length), so the line stays one short line."""
    if isinstance(value, int) and value.bit_length() > 1000:  # repr refuses past 4,300 digits
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits>"
    try:
        text = ascii(value) if isinstance(value, str) else repr(value)
    except (ValueError, RecursionError):  # a huge integer or a deep nesting inside
        return f"<a {type(value).__name__} too large to show>"
    if len(text) <= limit:
        return text
    size = (f"{len(value):,} entries" if isinstance(value, (list, dict))
            else f"{len(value if isinstance(value, str) else text):,} characters")
    return f"{text[:limit]}... ({size})"


def _printable(value: object) -> str:
    return shown(value)


def _uri_shown(uri: object) -> str:
    """A tracking URI as a message shows it: its password hidden (masked), cut short."""
    return shown(masked(uri) if isinstance(uri, str) else uri)


# Query parameters that carry a credential: the drivers read password= (and sslpassword=)
# from the URI, SQLAlchemy unquotes the key first (pass%77ord is password).
_SECRET_KEY = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)


def _secret_key(key: str) -> bool:
    from urllib.parse import unquote

    return _SECRET_KEY.search(unquote(key)) is not None


def masked(uri: str) -> str:
    """``uri`` with whatever could be a password replaced by ***: the text between the
    user name and the last '@' (a password may hold '/' or '?'), and the value of a query
    parameter named like a credential. Stricter than any driver's parser, so that a
    refusal line never echoes a secret."""
    head, sep, rest = uri.partition("://")
    if not sep:
        head, rest = "", uri
    user, at, host = rest.rpartition("@")
    if at and ":" in user:
        rest = f"{user.split(':', 1)[0]}:***@{host}"
    path, question, query = rest.partition("?")
    if question:
        pairs = [pair.partition("=") for pair in re.split(r"[&;]", query)]
        query = "&".join(f"{key}{eq}{'***' if eq and _secret_key(key) else value}" for key, eq, value in pairs)
        rest = f"{path}?{query}"
    return head + sep + rest


def password_in(uri: str) -> bool:
    """Whether ``uri`` carries a password: ``user:password@`` before its host (any ':'
    before the last '@', an empty password too) or a credential query parameter."""
    rest = uri.partition("://")[2] or uri
    user, at, _ = rest.rpartition("@")
    if at and ":" in user:
        return True
    query = rest.partition("?")[2]
    return any(_secret_key(pair.partition("=")[0]) for pair in re.split(r"[&;]", query) if pair)


def _credentials_hint(scheme: str) -> str:
    if scheme.startswith("postgresql"):
        return "PGPASSWORD or ~/.pgpass"
    if scheme.startswith("mysql"):
        return "an option file (?read_default_file=/home/you/.my.cnf)"
    return "the MLFLOW_TRACKING_USERNAME/PASSWORD variables"


def matches(pattern: str, value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(pattern, value, flags=re.ASCII) is not None


def check_name(value: object, where: str) -> str:
    """``value`` if it is a safe single path component, else GrammarError naming ``where``."""
    if not matches(NAME, value) or len(value) > NAME_MAX:
        raise GrammarError(f"{where} = {_printable(value)}: a name must be 1-{NAME_MAX} characters of a-z, 0-9, "
                           "'_', '.', '-', starting with a letter or digit (it becomes a folder name)")
    return value


def check_pattern(value: object, pattern: str, where: str, what: str) -> str:
    if not matches(pattern, value) or ".." in value:
        raise GrammarError(f"{where} = {_printable(value)}: not a valid {what}")
    return value


def check_tracking_uri(uri: object, where: str = "tracking.uri") -> str:
    """An MLflow tracking URI the workflow may pass on: a known scheme, no whitespace or
    shell metacharacters, ASCII only, no password (Snakemake prints and logs its command
    line and parameters); a SQLite file named relative to the project, inside it, with no
    query string (SQLite's ?uri=true would read ``file:`` names, ?vfs= and ?mode= change
    how and what it opens). Where the file really leads (links) is check_store_inside's."""
    if isinstance(uri, str) and password_in(uri):
        scheme = uri.partition("://")[0].lower()
        raise GrammarError(f"{where} = {_uri_shown(uri)}: holds a password, which Snakemake would print and log; "
                           f"give it in {_credentials_hint(scheme)} instead")
    match = _URI.fullmatch(uri) if isinstance(uri, str) else None
    if match is None:
        raise GrammarError(f"{where} = {_uri_shown(uri)}: not a tracking URI this workflow accepts (scheme://..., "
                           f"schemes {', '.join(TRACKING_SCHEMES)}; letters, digits and . _ : / ? = % @ + , - [ ] only, "
                           "no spaces or shell characters)")
    scheme, rest = match.group("scheme"), match.group("rest")
    if scheme not in TRACKING_SCHEMES:
        raise GrammarError(f"{where} = {_uri_shown(uri)}: unknown scheme {scheme!r} (known: "
                           f"{', '.join(TRACKING_SCHEMES)})")
    if scheme == "sqlite":
        sqlite_path(uri, where)
    elif not rest or (rest.startswith("/") and not _names_a_socket(rest)):
        raise GrammarError(f"{where} = {_uri_shown(uri)}: {scheme}:// needs a host (or a socket: "
                           f"?host=/run/postgresql, ?unix_socket=/run/mysqld/mysqld.sock)")
    return uri


_SQLITE_FILE = r"[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*"


def sqlite_path(uri: str, where: str = "tracking.uri") -> str:
    """The file of a ``sqlite:///<file>`` URI, relative to the project; GrammarError for
    any other form: an absolute path (four slashes), a query string (?uri=, ?mode=,
    ?vfs=, ...), a URI filename (file:) or any ':', '%', '@', and '.', '..' or empty
    parts. Every part starts with a letter, digit or '_' (no hidden files, no '..')."""
    rest = uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else None
    if rest is None or not rest or rest.startswith("/"):
        raise GrammarError(f"{where} = {_uri_shown(uri)}: a SQLite store is sqlite:///<file inside the project>, "
                           "e.g. sqlite:///mlflow.db (for a shared store use a database server or mlflow server)")
    if "?" in rest:
        raise GrammarError(f"{where} = {_uri_shown(uri)}: a SQLite store takes no query string (?uri=, ?mode=, "
                           "?vfs= change what file SQLite opens and how)")
    if not re.fullmatch(_SQLITE_FILE, rest, flags=re.ASCII):
        raise GrammarError(f"{where} = {_uri_shown(uri)}: the SQLite file must lie inside the project: letters, "
                           "digits, '_', '.', '-' and '/' only (no 'file:' names, no '..', '.' or empty parts)")
    return rest


def check_store_inside(uri: str, root: str | Path = ".", where: str = "tracking.uri") -> None:
    """A SQLite store whose file, or the files SQLite and the workflow keep beside it
    (-journal, -wal, -shm, .lock), leads out of the project ``root`` through a link in any
    existing part of its path: GrammarError naming ``where``. Other stores: nothing to
    check. The one check here that looks at the file system (links are resolved)."""
    if not uri.startswith("sqlite:"):
        return
    rest = sqlite_path(uri, where)
    top = Path(root).resolve()
    for name in (rest, *(rest + tail for tail in ("-journal", "-wal", "-shm", ".lock"))):
        try:
            target = (top / name).resolve()
        except (OSError, RuntimeError) as err:  # a link loop
            raise GrammarError(f"{where} = {_uri_shown(uri)}: {name} cannot be resolved ({err.__class__.__name__}); "
                               "the SQLite file must lie inside the project") from None
        if not target.is_relative_to(top):
            raise GrammarError(f"{where} = {_uri_shown(uri)}: {name} leads out of the project (to "
                               f"{shown(str(target))}) through a link; the SQLite file must lie inside it")


def _names_a_socket(rest: str) -> bool:
    """A database URI without a host that reaches its server through a socket file
    (postgresql:///db?host=/run/postgresql, mysql+pymysql:///db?unix_socket=/run/m.sock)."""
    key, _, value = rest.partition("?")[2].partition("=")  # one parameter: '&' is refused above
    return key in ("host", "unix_socket") and value.startswith("/")
