"""A hostile parameter file or --config override (issue 48): whatever its bytes, it is
refused in one line naming the file or the key, never with a traceback, never a hang,
before any job; products of values that are each within their bound, but together size
more memory than the machine holds, are refused the same way."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from darel import config
from darel.config import memory
from tests.conftest import ROOT, run_in, tiny_project

COMMITTED = (ROOT / "params.yaml").read_bytes()
SEED_LINE = b"seed: 0 "  # the committed file's seed line, where a case puts its bytes


def _with_seed(value: bytes) -> bytes:
    assert COMMITTED.count(SEED_LINE) == 1
    return COMMITTED.replace(SEED_LINE, b"seed: " + value + b" ", 1)


def _laughs_by_merge_keys() -> bytes:
    lines = [b"a0: &a0 {" + b", ".join(b"k%d: %d" % (i, i) for i in range(10)) + b"}"]
    lines += [b"a%d: &a%d {<<: [" % (n, n) + b", ".join([b"*a%d" % (n - 1)] * 9) + b"]}" for n in range(1, 9)]
    return COMMITTED + b"\n" + b"\n".join(lines) + b"\n"


# (case, the file's bytes, what the one line must say). Each is a parameter file as a
# user, a shared folder or a --config params_file= could hand it over.
FILES = [
    ("a 0xff byte", _with_seed(b"0\xff"), "byte 0xff at line 12, column 8 is not UTF-8"),
    ("a lone surrogate", _with_seed(b"'\xed\xa0\x80'"), "byte 0xed at line 12"),
    ("an overlong encoding", _with_seed(b"'\xc0\xaf'"), "byte 0xc0 at line 12"),
    ("a NUL", _with_seed(b"0\x00"), "character U+0000 at line 12, column 8"),
    ("an escape sequence", COMMITTED.replace(b"profile: quick", b"profile: q\x1b[2Jk", 1), "character U+001B"),
    ("a C1 control", _with_seed(b"'\xc2\x9b'"), "character U+009B at line 12"),
    ("DEL", _with_seed(b"0\x7f"), "character U+007F"),
    ("a 4,400-digit integer", _with_seed(b"1" * 4400), "a number of 4,400 characters"),
    ("a 4,400-digit float", _with_seed(b"1" * 4400 + b".5"), "a number of 4,402 characters"),
    ("a 100-digit integer", _with_seed(b"1" + b"0" * 99), "larger than any value may be"),
    ("a long hexadecimal integer", _with_seed(b"0x" + b"f" * 5000), "a number of 5,002 characters"),
    ("a base-60 integer", _with_seed(b"1" + b":59" * 3000), "a number of 9,001 characters"),
    ("a 4,400-digit key", COMMITTED + b"? " + b"1" * 4400 + b"\n: x\n", "a number of 4,400 characters"),
    ("an impossible date", _with_seed(b"2020-13-45"), "cannot read this value (ValueError"),
    ("an unhashable key", COMMITTED + b"? [a, b]\n: x\n", "found unhashable key"),
    ("a Python tag", COMMITTED + b"x: !!python/object/apply:os.system [id]\n", "could not determine a constructor"),
    ("an unknown tag", COMMITTED + b"x: !whatever 1\n", "could not determine a constructor"),
    ("an unclosed quote", _with_seed(b"'0"), "YAML syntax error"),
    ("a tab as indentation", COMMITTED + b"x:\n\ty: 1\n", "YAML syntax error"),
    ("an undefined alias", _with_seed(b"*nowhere"), "found undefined alias"),
    ("two documents", COMMITTED + b"---\nx: 1\n", "expected a single document"),
    ("a list at the top", b"- 1\n- 2\n", "expected a mapping of keys at the top level"),
    ("an empty file", b"", "expected a mapping of keys at the top level"),
    ("merge keys that copy billions", _laughs_by_merge_keys(), "merge keys (<<) copy more than 20,000 entries"),
    ("nesting 100,000 deep", b"x: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested more than 12 levels deep"),
    ("a file over the cap", COMMITTED + b"#" + b"x" * config.schema.MAX_PARAMS_BYTES + b"\n",
     "bytes, more than a parameter file may hold (1,048,576)"),
    ("a control character in a key", COMMITTED + b'"x\\e[2J": 1\n', "holds a control character"),
    ("a control character in a value", COMMITTED.replace(b"profile: quick", b'profile: "q\\0k"', 1),
     "profile = 'q\\x00k': holds a control character"),
]


def _refused(path: Path | str, overrides: dict | None = None) -> str:
    """The one line a load refuses with (ConfigError; any other exception fails the test)."""
    with pytest.raises(config.ConfigError) as err:
        config.load_params(path, overrides)
    line = str(err.value)
    assert "\n" not in line and "Traceback" not in line and len(line) <= 240, line
    return line


@pytest.mark.parametrize("case, data, needle", FILES, ids=[case for case, _, _ in FILES])
def test_any_bytes_in_a_parameter_file_are_refused_in_one_line(tmp_path, case, data, needle):
    path = tmp_path / "params.yaml"
    path.write_bytes(data)
    line = _refused(path)
    assert needle in line, (case, line)
    assert line.startswith((f"{path}: ", "params: ")), line  # names the file, or the key once it is parsed


def test_a_byte_order_mark_and_the_printable_planes_are_fine(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + COMMITTED + "# \u00e9\u4e2d\U0001f600\n".encode())
    assert config.load_params(path)["profile"] == "quick"


def _in_a_thread(call, timeout_s: float = 60):
    """``call()``'s result or exception; a hang fails the test instead of hanging it."""
    box: dict = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the read hangs"
    return box


@pytest.mark.parametrize("kind", ["fifo", "folder", "link", "dangling link"])
def test_a_parameter_file_that_is_not_a_regular_file_is_refused_without_waiting(tmp_path, kind):
    path = tmp_path / "params.yaml"
    real = tmp_path / "real.yaml"
    real.write_bytes(COMMITTED)
    if kind == "fifo":
        os.mkfifo(path)  # nobody ever writes to it: a plain open() would wait forever
    elif kind == "folder":
        path.mkdir()
    elif kind == "link":
        path.symlink_to(real)
    else:
        path.symlink_to(tmp_path / "absent.yaml")
    box = _in_a_thread(lambda: config.read_yaml(path))
    err = box.get("error")
    assert isinstance(err, config.ConfigError), box
    expected = {"fifo": "is a FIFO, not a regular file", "folder": "is a folder, not a regular file",
                "link": "is a link", "dangling link": "is a link"}[kind]
    assert str(err).startswith(f"{path}: {expected}") and "\n" not in str(err), str(err)


def test_a_file_that_grows_past_the_cap_while_read_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "params.yaml"
    path.write_bytes(COMMITTED)
    real_fstat = os.fstat

    def small_fstat(fd):  # the size judged before reading is the one the file had then
        info = real_fstat(fd)
        return os.stat_result((info.st_mode, info.st_ino, info.st_dev, info.st_nlink, info.st_uid, info.st_gid,
                               100, info.st_atime, info.st_mtime, info.st_ctime))

    monkeypatch.setattr(config.schema.os, "fstat", small_fstat)
    with pytest.raises(config.ConfigError, match="grew past 1,000 bytes while being read"):
        config.schema.read_params_text(path, limit=1000)


# --config overrides, as Snakemake hands them over (nested scalars as strings, top-level
# numbers parsed by int/float), and as an API caller could pass them.
OVERRIDES = [
    ("a 4,400-digit top-level number (Snakemake makes it inf)", {"seed": float("1" * 4400)},
     "params: seed = inf: must be a finite number"),
    ("a 4,400-digit nested number", {"darel": {"history_size": "1" * 4400}},
     "params: darel.history_size = '1111"),
    ("a 200-digit nested number", {"darel": {"history_size": "1" * 200}},
     "params: darel.history_size = '1111"),
    ("a 5,001-digit Python integer", {"seed": 10 ** 5000}, "params: seed = <an integer of about 5,001 digits>"),
    ("a NUL in a value", {"profile": "q\x00"}, "params: profile = 'q\\x00': holds a control character"),
    ("an escape sequence in a value", {"darel": {"mode": "hard\x1b[2J"}}, "holds a control character"),
    ("an escape sequence in a key", {"profiles": {"quick\x1b[2J": {}}}, "the key 'quick\\x1b[2J' holds a control"),
    ("a newline in a key", {"datasets": {"synth": {"sizes": {"a\nb": {}}}}}, "the key 'a\\nb' holds a control"),
    ("a 10^6-image data set at 256 px",
     {"datasets": {"synth": {"sizes": {"cpu": {"n_train": 1_000_000, "n_test": 1_000_000, "image_size": 256}}}}},
     "params: datasets.synth.sizes.cpu: 2,000,000 images of 256x256x3 bytes"),
    ("width 1024 at batch 65,536", {"protocols": {"resnet18": {"width": 1024, "batch": 65536}}},
     "batch 65536 x width 1024"),
    ("width 1024 at eval_batch 65,536", {"profiles": {"gpu": {"eval_batch": 65536, "models": {
        "resnet18_hc": {"width": 1024}}}}}, "params: profiles.gpu.models.resnet18_hc: eval_batch 65536 x width 1024"),
    ("a 1024 px input at batch 65,536", {"protocols": {"resnet18_hc": {"batch": 65536, "input_size": 1024,
                                                                       "stem": "cifar"}}},
     "batch 65536 x width 64 at 1024x1024 px"),
    ("a language model fine-tuned at batch 65,536 x 65,536 tokens",
     {"nlg": {"finetune": {"batch": 65536, "max_length": 65536}}}, "fine-tuned at batch"),
    ("a stand-in of 256 layers of 65,536", {"profiles": {"quick": {"nlg": {"models": {
        "gpt2-large": {"n_embd": 65536, "n_layer": 256, "n_head": 4}}}}}},
     "params: profiles.quick.nlg.models.gpt2-large: 13,194,676,404,224 parameters"),
    ("64 beams of 512 + 4,096 tokens", {"nlg": {"decoding": {"num_beams": 64, "max_new_tokens": 4096}}},
     "params: profiles.paper.nlg.models.gpt2-medium: 64 beams x 4,608 tokens"),
]


@pytest.mark.parametrize("case, override, needle", OVERRIDES, ids=[case for case, _, _ in OVERRIDES])
def test_hostile_overrides_are_refused_in_one_line(case, override, needle, monkeypatch):
    monkeypatch.setattr(memory, "machine_memory", lambda: 16 << 30)  # the same verdicts on any test machine
    with pytest.raises(config.ConfigError) as err:
        config.workflow_config(ROOT / "params.yaml", override)
    line = str(err.value)
    assert needle in line and line.startswith("params: "), (case, line)
    assert "\n" not in line and "\x1b" not in line and "\x00" not in line and len(line) <= 240, line


def test_the_memory_ceiling_is_this_machines_and_the_committed_profiles_fit_under_it(monkeypatch):
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    assert memory.machine_memory() == pages * size
    cfg = config.load_params(ROOT / "params.yaml")
    for profile in ("quick", "gpu", "paper"):
        config.load_params(ROOT / "params.yaml", {"profile": profile})
    # The committed profiles fit a machine with 16 GiB (the floors count only what cannot be avoided).
    monkeypatch.setattr(memory, "machine_memory", lambda: 16 << 30)
    config.validate(cfg)
    # A product that this machine's memory decides: 1,000,000 images of 64x64x3 need 11.4 GiB.
    big = config.merge(cfg, {"datasets": {"synth": {"sizes": {"cpu": {"n_train": 1_000_000, "n_test": 1000,
                                                                      "image_size": 64}}}}})
    config.validate(big)
    monkeypatch.setattr(memory, "machine_memory", lambda: 8 << 30)
    with pytest.raises(config.ConfigError, match=r"\(n_train \+ n_test\): at least 11\.5 GiB of memory; this "
                                                 r"machine has 8\.0 GiB"):
        config.validate(big)


def test_the_memory_floors_are_below_what_the_models_really_keep():
    """The image-model floor against autograd's saved tensors of a real training step."""
    import torch

    from darel.models import build_model

    for name, stem, side, width in (("resnet18", "cifar", 16, 8), ("resnet18_hc", "imagenet", 64, 8)):
        kwargs = {"stem": stem} if name == "resnet18" else {"stem": stem, "algebra": "dual"}
        model = build_model(name, 10, width=width, **kwargs)
        saved: dict[tuple, int] = {}

        def pack(tensor):
            saved[(tensor.data_ptr(), tensor.numel())] = tensor.numel() * tensor.element_size()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(torch.randn(2, 3, side, side)).sum().backward()
        floor = memory.image_model_bytes({"width": width, "batch": 2, "stem": stem}, 1, 0, side)
        assert floor["step"] <= sum(saved.values()), name
        params = sum(p.numel() for p in model.parameters())
        assert floor["weights"] <= params * 4 * memory.OPTIMISER_COPIES, name


# ---- through Snakemake: one line, before any job, nothing written outside --------------------------

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


@pytest.mark.slow
def test_hostile_parameters_stop_snakemake_in_one_line_before_any_job(tmp_path):
    """Item 3's URI and its variants, a password, bytes no YAML holds, a FIFO as the
    parameter file and an absurd product, each through a real Snakemake invocation."""
    project = tiny_project(tmp_path / "project", lambda params: params)
    outside = tmp_path / "outside"
    outside.mkdir()
    committed = (project / "params.yaml").read_bytes()
    os.mkfifo(project / "fifo.yaml")
    marker = f"MARKER{os.getpid()}pw"  # not literally in any file of the project (this one included)
    bad_byte = committed.replace(b"seed: 0", b"seed: 0\xff", 1)
    cases = [  # (what, params.yaml bytes, --config arguments, the start of the one line)
        ("sqlite URI filename", committed, ["--config", f"tracking={{uri: 'sqlite:///file:{outside}/x.db?uri=true'}}"],
         "params: tracking.uri = "),
        ("sqlite ?mode=", committed, ["--config", "tracking={uri: 'sqlite:///x.db?mode=rwc'}"], "params: tracking.uri"),
        ("sqlite four slashes", committed, ["--config", f"tracking={{uri: 'sqlite:///{outside}/x.db'}}"],
         "params: tracking.uri"),
        ("sqlite through a link", committed, ["--config", "tracking={uri: 'sqlite:///out/x.db'}"],
         "params: tracking.uri = 'sqlite:///out/x.db': out/x.db leads out of the project"),
        ("password", committed, ["--config", f"tracking={{uri: 'postgresql://u:{marker}@127.0.0.1:9/db'}}"],
         "params: tracking.uri = 'postgresql://u:***@127.0.0.1:9/db': holds a password"),
        ("0xff byte", bad_byte, [], "params.yaml: byte 0xff at line"),
        ("FIFO parameter file", committed, ["--config", "params_file=fifo.yaml"], "fifo.yaml: is a FIFO"),
        ("absurd product", committed, ["--config", "protocols={resnet18: {width: 1024, batch: 65536}}"],
         "params: profiles."),
    ]
    (project / "out").symlink_to(outside)
    for what, data, extra, start in cases:
        (project / "params.yaml").write_bytes(data)
        out = run_in(project, SNAKEMAKE, "--cores", "1", "results/table1.csv", *extra, check=False, timeout=900)
        text = out.stdout + out.stderr
        lines = [line for line in text.splitlines() if line.startswith(start)]
        assert out.returncode != 0 and len(lines) == 1 and "(nothing was run" in text, (what, text[-2000:])
        assert len(lines[0]) <= 240 and "Traceback" not in text, (what, text[-2000:])
        assert marker not in text, what
        assert list(outside.iterdir()) == [], (what, list(outside.iterdir()))
        for folder in ("data", "runs", "logs", "results/cells"):
            assert not (project / folder).exists(), (what, folder)
    hits = [str(p) for p in project.rglob("*") if p.is_file() and not p.is_symlink() and p.name != "fifo.yaml"
            and marker.encode() in p.read_bytes()]
    assert hits == []
