from __future__ import annotations

import copy
import re
import csv
import zipfile

import numpy as np
import pytest
import torch

from darel.nlg import readers as nlg_readers
from darel.nlg.readers import read_e2e_csv, read_webnlg_xml
from darel.nlg.schemas import (
    NLGExample,
    format_mr,
    linearise_triples,
    parse_mr,
    parse_triple,
    read_split,
    training_pairs,
    write_e2e_refs,
    write_split,
)
from darel.nlg.synthetic import E2E_SLOTS, e2e_value_mentions, make_synthetic_e2e, make_synthetic_webnlg
from darel.nlg.lm import (
    beam_search_ids,
    IGNORE_INDEX,
    add_lora,
    build_lm,
    encode_pairs,
    finetune,
    generate,
    generate_ids,
    generate_with_cuts,
    load_with_adapter,
    pair_texts,
    per_sample_lm_loss,
    pretrain_lm,
    prompt_ids,
    tiny_gpt2_config,
    trainable_parameter_names,
)
from darel.nlg.tokenizer import SEPARATOR, load_tokenizer, save_tokenizer, train_bpe_tokenizer

PROTOCOL = dict(lr=2e-4, betas=(0.9, 0.999), weight_decay=0.01, label_smoothing=0.1, precision="fp32", device="cpu")


# ---------------------------------------------------------------------------
# E2E meaning representations


def test_parse_mr_round_trip():
    mr = "name[The Eagle], eatType[coffee shop], food[French], priceRange[£20-25], customer rating[3 out of 5]"
    slots = parse_mr(mr)
    assert list(slots) == ["name", "eatType", "food", "priceRange", "customer rating"]
    assert slots["customer rating"] == "3 out of 5"
    assert format_mr(slots) == mr
    # Irregular spacing parses to the same slots.
    assert parse_mr("name[The Eagle] ,eatType[ coffee shop ],food[French]") == {
        "name": "The Eagle", "eatType": "coffee shop", "food": "French"
    }


@pytest.mark.parametrize(
    "bad",
    ["", "name[The Eagle", "name[The Eagle],", "name[]", "name[A], name[B]", "name The Eagle", "name[A] food[B]"],
)
def test_parse_mr_rejects_malformed(bad):
    with pytest.raises(ValueError) as err:
        parse_mr(bad)
    assert repr(bad) in str(err.value)


def test_synthetic_e2e_mentions_every_value_with_distinct_references():
    examples = make_synthetic_e2e(40, refs_per_mr=(2, 5), seed=3)
    assert len(examples) == 40
    assert len({example.source for example in examples}) == 40
    for example in examples:
        slots = parse_mr(example.source)
        assert "name" in slots and len(slots) >= 3
        for slot, value in slots.items():
            assert value in E2E_SLOTS[slot]
        assert 2 <= len(example.references) <= 5
        assert len(set(example.references)) == len(example.references)
        for ref in example.references:
            assert ref[0].isupper() and ref.endswith(".")
            for slot, value in slots.items():
                for mention in e2e_value_mentions(slot, value):
                    assert mention in ref.lower(), (slot, value, ref)
    assert make_synthetic_e2e(40, seed=3) == examples  # deterministic per seed
    assert make_synthetic_e2e(40, seed=4) != examples


def test_training_pairs_expand_every_reference():
    examples = [NLGExample("a[b], c[d], e[f]", ("one.", "two.")), NLGExample("a[x], c[y], e[z]", ("three.",))]
    assert training_pairs(examples) == [
        ("a[b], c[d], e[f]", "one."), ("a[b], c[d], e[f]", "two."), ("a[x], c[y], e[z]", "three.")
    ]


# ---------------------------------------------------------------------------
# WebNLG


def test_linearise_triples_and_parse_triple():
    triples = ["Aarhus_Airport | cityServed | \"Aarhus, Denmark\"", ("Aarhus_Airport", "runwayLength", "2776.0")]
    assert linearise_triples(triples) == (
        "Aarhus Airport : cityServed : Aarhus, Denmark | Aarhus Airport : runwayLength : 2776.0"
    )
    with pytest.raises(ValueError, match="Aarhus_Airport cityServed"):
        parse_triple("Aarhus_Airport cityServed Aarhus")


def test_synthetic_webnlg_mentions_every_object():
    examples = make_synthetic_webnlg(40, seed=5)
    assert len({example.source for example in examples}) == 40
    sizes = set()
    for example in examples:
        triples = [part.split(" : ") for part in example.source.split(" | ")]
        sizes.add(len(triples))
        assert 1 <= len(triples) <= 4
        assert len({subject for subject, _, _ in triples}) == 1
        assert len(example.references) >= 2 and len(set(example.references)) == len(example.references)
        for ref in example.references:
            for subject, _, obj in triples:
                assert obj in ref, (obj, ref)
            assert triples[0][0] in ref
    assert sizes == {1, 2, 3, 4}


# ---------------------------------------------------------------------------
# Files


def test_split_round_trip_and_errors(tmp_path):
    examples = make_synthetic_e2e(5, seed=0) + [NLGExample("name[Café Ü], eatType[pub], area[riverside]", ("Ü \"q\".",))]
    path = tmp_path / "train.jsonl"
    write_split(path, examples)
    assert read_split(path) == examples
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temp file
    path.write_text(path.read_text(encoding="utf-8") + '{"source": "x"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"train.jsonl:{len(examples) + 1}:"):
        read_split(path)


def test_e2e_refs_file_format(tmp_path):
    examples = [NLGExample("a[1], b[2], c[3]", ("First one.", "Second one.")), NLGExample("a[4], b[5], c[6]", ("Third.",))]
    path = tmp_path / "refs.txt"
    write_e2e_refs(path, examples)
    assert path.read_text(encoding="utf-8") == "First one.\nSecond one.\n\nThird.\n"
    with pytest.raises(ValueError, match="example 0"):
        write_e2e_refs(path, [NLGExample("a[1], b[2], c[3]", ("line\nbreak",))])


def _write_e2e_csv(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["mr", "ref"])
        writer.writerows(rows)


E2E_ROWS = [
    ("name[The Eagle], eatType[coffee shop], food[French]", "The Eagle is a French coffee shop."),
    ("name[Alimentum], area[city centre], familyFriendly[no]", "Alimentum, in the city centre, is not kid friendly."),
    ("name[The Eagle], eatType[coffee shop], food[French]", "A coffee shop, The Eagle, serves French food."),
]


def test_read_e2e_csv_groups_by_mr(tmp_path):
    path = tmp_path / "devset.csv"
    _write_e2e_csv(path, E2E_ROWS)
    examples = read_e2e_csv(path, expected_rows=3)
    assert examples == [
        NLGExample(E2E_ROWS[0][0], (E2E_ROWS[0][1], E2E_ROWS[2][1])),
        NLGExample(E2E_ROWS[1][0], (E2E_ROWS[1][1],)),
    ]
    with pytest.raises(ValueError, match="expected 4 data rows, found 3"):
        read_e2e_csv(path, expected_rows=4)
    _write_e2e_csv(path, E2E_ROWS + [("name[Broken, food[French]", "Text.")])
    with pytest.raises(ValueError, match=r"devset.csv:5: malformed meaning representation 'name\[Broken"):
        read_e2e_csv(path)


def test_download_e2e_extracts_and_validates_a_local_archive(tmp_path, monkeypatch):
    # The archive is already in place, so nothing is fetched; the row counts are checked.
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for filename in nlg_readers.E2E_FILES.values():
        _write_e2e_csv(csv_dir / filename, E2E_ROWS)
    with zipfile.ZipFile(tmp_path / nlg_readers.E2E_ARCHIVE_NAME, "w") as bundle:
        for filename in nlg_readers.E2E_FILES.values():
            bundle.write(csv_dir / filename, f"e2e-dataset/{filename}")
    monkeypatch.setattr(nlg_readers, "E2E_ROWS", {"train": 3, "dev": 3, "test": 3})
    paths = nlg_readers.download_e2e(tmp_path, progress=False)
    assert set(paths) == {"train", "dev", "test"} and len(read_e2e_csv(paths["test"])) == 2
    monkeypatch.setattr(nlg_readers, "E2E_ROWS", {"train": 42061, "dev": 3, "test": 3})
    with pytest.raises(ValueError, match="expected 42061 data rows, found 3"):
        nlg_readers.download_e2e(tmp_path, progress=False)


WEBNLG_2017 = """<?xml version="1.0" ?>
<benchmark><entries>
  <entry category="Airport" eid="Id1" size="1">
    <originaltripleset><otriple>Aarhus_Airport | cityServed | "Aarhus, Denmark"@en</otriple></originaltripleset>
    <modifiedtripleset><mtriple>Aarhus_Airport | cityServed | "Aarhus, Denmark"</mtriple></modifiedtripleset>
    <lex comment="good" lid="Id1">The Aarhus is the airport of Aarhus, Denmark.</lex>
    <lex comment="good" lid="Id2">Aarhus Airport serves the city of
      Aarhus, Denmark.</lex>
  </entry>
</entries></benchmark>
"""

WEBNLG_NESTED = """<?xml version="1.0" ?>
<benchmark><entries>
  <entry category="Astronaut" eid="Id7" size="2">
    <modifiedtripleset>
      <mtriple>Alan_Shepard | birthPlace | New_Hampshire</mtriple>
      <mtriple>Alan_Shepard | occupation | Test_pilot</mtriple>
    </modifiedtripleset>
    <lex comment="good" lid="Id1" lang="en">
      <sortedtripleset><sentence ID="1"/></sortedtripleset>
      <text>Alan Shepard, born in New Hampshire, was a test pilot.</text>
      <template>AGENT-1 was born in BRIDGE-1.</template>
    </lex>
    <lex lid="Id2" lang="ru">Алан Шепард родился в Нью-Гэмпшире.</lex>
  </entry>
</entries></benchmark>
"""


def test_read_webnlg_xml_folder(tmp_path):
    folder = tmp_path / "train"
    (folder / "1triples").mkdir(parents=True)
    (folder / "2triples").mkdir()
    (folder / "1triples" / "Airport.xml").write_text(WEBNLG_2017, encoding="utf-8")
    (folder / "2triples" / "Astronaut.xml").write_text(WEBNLG_NESTED, encoding="utf-8")
    examples = read_webnlg_xml(folder, expected_entries=2)
    assert examples[0] == NLGExample(
        "Aarhus Airport : cityServed : Aarhus, Denmark",
        ("The Aarhus is the airport of Aarhus, Denmark.", "Aarhus Airport serves the city of Aarhus, Denmark."),
    )
    assert examples[1] == NLGExample(
        "Alan Shepard : birthPlace : New Hampshire | Alan Shepard : occupation : Test pilot",
        ("Alan Shepard, born in New Hampshire, was a test pilot.",),
    )
    no_lex = tmp_path / "test.xml"
    no_lex.write_text(WEBNLG_2017.replace("<lex", "<other").replace("</lex>", "</other>"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"test.xml: entry eid=Id1: no English <lex>"):
        read_webnlg_xml(no_lex)


def test_download_webnlg_extracts_the_2017_folder(tmp_path, monkeypatch):
    # The archive is already in place, so nothing is fetched; its content must be the pinned one.
    from darel.data import IntegrityError

    files = {"train/1triples/Airport.xml": WEBNLG_2017, "dev/2triples/Astronaut.xml": WEBNLG_NESTED,
             "test/testdata_with_lex.xml": WEBNLG_2017}
    with zipfile.ZipFile(tmp_path / nlg_readers.WEBNLG2017_ARCHIVE_NAME, "w") as bundle:
        bundle.writestr("webnlg-dataset-master/release_v2/xml/other.xml", "<benchmark/>")
        for name, text in files.items():
            bundle.writestr(f"webnlg-dataset-master/webnlg_challenge_2017/{name}", text)
    with pytest.raises(IntegrityError, match="nothing was extracted"):
        nlg_readers.download_webnlg(tmp_path, progress=False)  # not the release's content
    assert not (tmp_path / "webnlg_challenge_2017").exists()
    monkeypatch.setattr(nlg_readers, "WEBNLG2017_CONTENT_SHA256", nlg_readers.webnlg2017_content_sha256(
        {name: text.encode() for name, text in files.items()}))
    folder = nlg_readers.download_webnlg(tmp_path, progress=False)
    assert folder == tmp_path / "webnlg_challenge_2017"
    assert not (tmp_path / "release_v2").exists()
    sizes = {split: len(read_webnlg_xml(folder / rel)) for split, rel in nlg_readers.WEBNLG2017_SPLITS.items()}
    assert sizes == {"train": 1, "dev": 1, "test": 1}


# ---------------------------------------------------------------------------
# Tokenizer, encoding, models


@pytest.fixture(scope="module")
def e2e_examples():
    return make_synthetic_e2e(60, refs_per_mr=(2, 4), seed=11)


@pytest.fixture(scope="module")
def tokenizer(e2e_examples):
    texts = [text for pair in training_pairs(e2e_examples) for text in pair]
    return train_bpe_tokenizer(texts, vocab_size=600, min_frequency=2)


@pytest.fixture(scope="module")
def pretrained_tiny(tokenizer, e2e_examples):
    torch.set_num_threads(1)
    config = tiny_gpt2_config(len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = build_lm(config, seed=0)
    result = pretrain_lm(
        model, tokenizer, pair_texts(tokenizer, training_pairs(e2e_examples)), epochs=2, batch_size=16, lr=3e-3
    )
    assert len(result["train_loss"]) == 2 and result["train_loss"][1] < result["train_loss"][0]
    return model


def test_tokenizer_round_trip_and_save(tokenizer, tmp_path):
    text = "name[Café Zoë], priceRange[£20-25] — never seen: 日本"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert {tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.sep_token_id} == {0, 1, 2}
    assert tokenizer.convert_tokens_to_ids(SEPARATOR) == tokenizer.sep_token_id
    save_tokenizer(tokenizer, tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok")
    assert loaded(text, add_special_tokens=False)["input_ids"] == ids
    assert loaded.sep_token_id == tokenizer.sep_token_id and loaded.pad_token_id == tokenizer.pad_token_id
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe_tokenizer(["abc"], vocab_size=100)


def test_encode_pairs_masks_source_and_padding(tokenizer):
    pairs = [("name[A], food[French], area[riverside]", "A serves French food."), ("name[B], eatType[pub], near[C]", "B is a pub near C, a long way from anywhere else.")]
    batch = encode_pairs(tokenizer, pairs, max_length=128)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.shape == mask.shape == labels.shape
    for row, (source, target) in enumerate(pairs):
        prompt = tokenizer(source, add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id]
        target_ids = tokenizer(" " + target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        length = len(prompt) + len(target_ids)
        assert ids[row, :length].tolist() == prompt + target_ids
        assert mask[row].tolist() == [1] * length + [0] * (ids.shape[1] - length)
        assert (labels[row, : len(prompt)] == IGNORE_INDEX).all()
        assert labels[row, len(prompt) : length].tolist() == target_ids
        assert (labels[row, length:] == IGNORE_INDEX).all()
        assert (ids[row, length:] == tokenizer.pad_token_id).all()
    assert tokenizer.decode(ids[0][labels[0] != IGNORE_INDEX], skip_special_tokens=True).strip() == pairs[0][1]


def test_encode_pairs_refuses_overlong_pairs(tokenizer):
    source = "name[The Eagle], eatType[coffee shop]"
    prompt_length = len(tokenizer(source, add_special_tokens=False)["input_ids"]) + 1
    long_target = "The Eagle is a coffee shop. " * 20
    with pytest.raises(ValueError, match=r"pair 1 \(source .name\[The Eagle\], eatType\[coffee shop\].\): source \+ target take"):
        encode_pairs(tokenizer, [(source, "Short."), (source, long_target)], max_length=prompt_length + 10)
    cut = encode_pairs(tokenizer, [(source, long_target)], max_length=prompt_length + 10, truncate=True)
    assert cut["input_ids"].shape == (1, prompt_length + 10)
    # A source with no room left for a target is refused even with truncate=True.
    with pytest.raises(ValueError, match=r"pair 0 \(source .*\): source takes"):
        encode_pairs(tokenizer, [(source, "x")], max_length=prompt_length, truncate=True)


def test_gpt2_style_tokenizer_separates_with_bos_and_pads_with_eos(tokenizer):
    # Pretrained GPT-2's tokenizer has only <|endoftext|> (bos = eos = unk), no sep or pad.
    from transformers import PreTrainedTokenizerFast

    gpt2_like = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    assert gpt2_like.sep_token_id is None and gpt2_like.pad_token_id is None
    end = gpt2_like.eos_token_id
    batch = encode_pairs(gpt2_like, [("a[b], c[d], e[f]", "Longer target text."), ("g[h], i[j], k[l]", "Short.")], 64)
    source_ids = gpt2_like("a[b], c[d], e[f]", add_special_tokens=False)["input_ids"]
    assert batch["input_ids"][0, len(source_ids)].item() == end  # the separator
    padding = batch["attention_mask"][1] == 0
    assert padding.any() and (batch["input_ids"][1][padding] == end).all()


def test_initial_weights_depend_on_the_seed_alone(tokenizer, pretrained_tiny):
    """A stand-in's initial weights and a LoRA adapter's A matrices are functions of the
    seed, whatever the process drew before, and leave torch's default generator as it was
    (issue 32: an unseeded initialisation made every pretraining differ)."""
    config = tiny_gpt2_config(len(tokenizer), n_embd=16, n_layer=1, n_head=2)
    with pytest.raises(ValueError, match="needs a seed"):
        build_lm(config)

    def draws(make):
        torch.rand(int(torch.randint(1, 50, (1,))))  # an arbitrary amount drawn before
        state = torch.get_rng_state()
        weights = {name: value.clone() for name, value in make().state_dict().items()}
        assert torch.equal(torch.get_rng_state(), state)
        return weights

    for make in (lambda: build_lm(config, seed=3), lambda: add_lora(copy.deepcopy(pretrained_tiny), seed=3)):
        first, again = draws(make), draws(make)
        assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    other = {n: v for n, v in add_lora(copy.deepcopy(pretrained_tiny), seed=4).state_dict().items() if "lora_A" in n}
    assert any(not torch.equal(other[n], first[n]) for n in other)


def test_deterministic_runtime_is_switched_on_and_off():
    from darel.runtime import configure_runtime

    try:
        configure_runtime(torch.device("cpu"), 1, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled() and torch.get_num_threads() == 1
    finally:
        torch.use_deterministic_algorithms(False)


def test_lora_trains_only_adapters(tokenizer, pretrained_tiny, e2e_examples):
    model = add_lora(copy.deepcopy(pretrained_tiny))
    names = trainable_parameter_names(model)
    assert names and all(".lora_A." in name or ".lora_B." in name for name in names)
    assert all(".c_attn." in name for name in names)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    pairs = training_pairs(e2e_examples)[:8]
    result = finetune(
        model, tokenizer, pairs, epochs=1, batch_size=8, warmup_steps=0, max_length=128, seed=0,
        progress=False, **PROTOCOL,
    )
    assert result["steps"] == 1
    changed = []
    for name, param in model.named_parameters():
        if name in names:
            if not torch.equal(param, before[name]):
                changed.append(name)
        else:
            assert torch.equal(param, before[name]), name
    assert any(".lora_B." in name for name in changed)


def test_finetune_reports_table1_memory_definition(tokenizer, pretrained_tiny, e2e_examples):
    from darel.measure import CPU_MEMORY_SOURCE

    pairs = training_pairs(e2e_examples)[:8]
    peaks = {}
    for batch in (2, 8):
        model = add_lora(copy.deepcopy(pretrained_tiny))
        result = finetune(model, tokenizer, pairs, epochs=1, batch_size=batch, warmup_steps=0, max_length=128,
                          seed=0, progress=False, **PROTOCOL)
        assert result["memory_source"] == CPU_MEMORY_SOURCE
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        assert result["peak_mem_bytes"] > param_bytes  # + LoRA grads, Adam state, saved activations
        peaks[batch] = result["peak_mem_bytes"]
    assert peaks[8] > peaks[2]  # activations grow with the batch


def test_cpu_memory_count_after_the_clock_equals_counting_every_step(tokenizer, pretrained_tiny, e2e_examples,
                                                                      monkeypatch):
    """On a CPU only shapes no counted shape dominates are counted, replayed after each
    epoch's timed interval: the same peak as counting every step where it runs, and the
    same adapter as a run with no meter at all (counting in place runs the operators
    under a dispatch mode, which moved the losses in the 6th digit)."""
    import contextlib

    from darel.measure import StepMemoryMeter

    pairs = training_pairs(e2e_examples)[:24]  # three batches of different widths, two epochs
    counted_in_place = []
    original_step = StepMemoryMeter.step

    def spying_step(self, key=None, kind="train", replay=None):
        counted_in_place.append(replay is None)
        return original_step(self, key=key, kind=kind, replay=replay)

    def train(mode):
        counted_in_place.clear()
        model = add_lora(copy.deepcopy(pretrained_tiny))
        result = finetune(model, tokenizer, pairs, epochs=2, batch_size=8, warmup_steps=0, max_length=128, seed=0,
                          progress=False, memory_count=mode, **PROTOCOL)
        return result, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    monkeypatch.setattr(StepMemoryMeter, "step", spying_step)
    in_place, _ = train("in_place")
    assert counted_in_place == [True] * 6  # every step of both epochs
    deferred, adapter = train("deferred")
    assert counted_in_place and not any(counted_in_place) and len(counted_in_place) < 6
    assert deferred["peak_mem_bytes"] == in_place["peak_mem_bytes"]
    monkeypatch.setattr(StepMemoryMeter, "step", lambda self, *a, **k: contextlib.nullcontext())
    unmetered, plain_adapter = train("deferred")  # no meter at all
    assert deferred["train_loss"] == unmetered["train_loss"]
    assert all(torch.equal(adapter[n], plain_adapter[n]) for n in plain_adapter)


def test_tiny_end_to_end(tokenizer, pretrained_tiny, e2e_examples, tmp_path):
    model = add_lora(copy.deepcopy(pretrained_tiny))
    pairs = training_pairs(e2e_examples)
    epochs_seen = []
    result = finetune(
        model, tokenizer, pairs, epochs=1, batch_size=8, warmup_steps=5, max_length=128, seed=1,
        progress=False, on_epoch_end=lambda epoch, record: epochs_seen.append(epoch), **PROTOCOL,
    )
    assert epochs_seen == [0]
    for key in ("train_loss", "lr", "epoch_time_s", "tokens_per_s"):
        assert len(result[key]) == 1 and np.isfinite(result[key][0])
    assert result["steps"] == -(-len(pairs) // 8) and result["tokens_trained"] > result["target_tokens"] > 0

    sources = [example.source for example in e2e_examples[:5]]
    outputs = generate(model, tokenizer, sources, num_beams=2, max_new_tokens=16, batch_size=4)
    assert len(outputs) == len(sources) and all(isinstance(text, str) for text in outputs)
    # Left padding must not change what a source decodes to.
    assert generate(model, tokenizer, sources, num_beams=2, max_new_tokens=16, batch_size=1) == outputs
    # An output is flagged as cut exactly when it used every new token without ending.
    for limit in (2, 16):
        texts, cut = generate_with_cuts(model, tokenizer, sources, num_beams=2, max_new_tokens=limit, batch_size=4)
        ids = generate_ids(model, [prompt_ids(tokenizer, s) for s in sources], pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, num_beams=2, max_new_tokens=limit, batch_size=4)
        assert cut == [len(new) == limit for new in ids]
        if limit == 2:
            assert any(cut)  # no trained model writes an E2E sentence in two tokens
        else:
            assert texts == outputs

    # The adapter saved by save_pretrained reloads onto the saved base model.
    pretrained_tiny.save_pretrained(tmp_path / "base")
    model.save_pretrained(tmp_path / "adapter")
    reloaded = load_with_adapter(tmp_path / "base", tmp_path / "adapter")
    batch = encode_pairs(tokenizer, pairs[:4], max_length=128)
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        actual = reloaded.eval()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(actual, expected)

    losses = per_sample_lm_loss(model, tokenizer, pairs[:12], batch_size=5)
    assert losses.shape == (12,) and np.isfinite(losses).all() and (losses > 0).all()
    one_by_one = [per_sample_lm_loss(model, tokenizer, [pair], batch_size=1)[0] for pair in pairs[:3]]
    np.testing.assert_allclose(losses[:3], one_by_one, rtol=1e-4)


def test_paper_path_prepares_hub_models_and_records_revision(tokenizer, pretrained_tiny, e2e_examples, tmp_path):
    """The paper profile's tokenizer and model stage, with a local folder standing in for
    a hub name (nothing can be downloaded here): weights load unchanged, and the
    requested revision and resolved commit are recorded (no commit for a folder)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    from darel.nlg.lm import resolve_hub_revision
    from darel.provenance import read_record, write_folder_record

    hub = tmp_path / "gpt2-like"
    pretrained_tiny.save_pretrained(hub)
    save_tokenizer(tokenizer, hub)
    assert resolve_hub_revision(str(hub)) is None
    data = tmp_path / "data"
    write_split(data / "train.jsonl", e2e_examples[:5])
    write_split(data / "test.jsonl", e2e_examples[5:8])
    write_folder_record(data, "meta.json", {"dataset": "e2e", "label": "test"})  # what nlg_data seals
    params = json.dumps({"dataset": "e2e", "model": "gpt2-medium", "seed": 0, "synthetic": False,
                         "architecture": {"hub": str(hub)}, "tokenizer": {}, "pretrain": {}, "device": "cpu",
                         "threads": 1, "amp": False, "eval_batch": 8, "precision": "fp32",
                         "decoding": {"max_new_tokens": 16}})
    stage = [sys.executable, str(Path(__file__).resolve().parents[1] / "stages" / "nlg_prepare_model.py"),
             "--params", params, "--data-dir", str(data), "--tokenizer-dir", str(tmp_path / "tok")]
    for extra in (["--train-tokenizer"], ["--out-dir", str(tmp_path / "model")]):
        proc = subprocess.run(stage + extra, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert load_tokenizer(tmp_path / "tok").get_vocab() == tokenizer.get_vocab()
    summary = read_record(tmp_path / "model" / "pretrain.json")
    assert summary.pop("files_sha256").keys() == {"config.json", "generation_config.json", "model.safetensors"}
    assert summary == {"source": f"hub:{hub}", "revision_requested": None, "hub_commit": None}
    saved, original = load_file(tmp_path / "model" / "model.safetensors"), load_file(hub / "model.safetensors")
    assert saved.keys() == original.keys()
    assert all(torch.equal(saved[key], original[key]) for key in saved)



def test_interrupted_finetune_resumes_to_the_same_adapter(tokenizer, pretrained_tiny, e2e_examples, tmp_path, capsys):
    pairs = training_pairs(e2e_examples)[:20]
    common = dict(epochs=3, batch_size=8, warmup_steps=2, max_length=128, seed=0, progress=False, **PROTOCOL)

    def fresh():  # the same LoRA initialisation every time
        torch.manual_seed(3)
        return add_lora(copy.deepcopy(pretrained_tiny))

    whole_model = fresh()  # LoRA and GPT-2 dropout on: the random state must be restored too
    whole = finetune(whole_model, tokenizer, pairs, **common)

    checkpoint = tmp_path / "finetune_ckpt.pt"

    def crash_after_second_epoch(epoch, record):
        if epoch == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        finetune(fresh(), tokenizer, pairs, checkpoint_path=checkpoint,
                 on_epoch_end=crash_after_second_epoch, **common)
    resumed_model = fresh()
    resumed = finetune(resumed_model, tokenizer, pairs, checkpoint_path=checkpoint, **common)
    assert whole["resumed_from_epoch"] is None and resumed["resumed_from_epoch"] == 2
    assert resumed["train_loss"] == whole["train_loss"]
    for key in ("steps", "tokens_trained", "target_tokens", "epochs_completed"):
        assert resumed[key] == whole[key], key
    assert resumed["time_s"] > 0 and len(resumed["epoch_time_s"]) == 3
    for (name, a), (_, b) in zip(whole_model.named_parameters(), resumed_model.named_parameters()):
        assert torch.equal(a, b), name

    # Another data set (or other settings, LoRA's included) must not pick the checkpoint up.
    capsys.readouterr()
    other = finetune(fresh(), tokenizer, pairs[:12], checkpoint_path=checkpoint, **common)
    assert other["resumed_from_epoch"] is None
    assert "another configuration" in capsys.readouterr().err
    torch.manual_seed(3)
    other_lora = add_lora(copy.deepcopy(pretrained_tiny), alpha=16)
    again = finetune(other_lora, tokenizer, pairs[:12], checkpoint_path=checkpoint, **common)
    assert again["resumed_from_epoch"] is None
    # The frozen base is fingerprinted by content: two swapped embedding rows (the same
    # weight sum) are another base model.
    swapped = copy.deepcopy(pretrained_tiny)
    with torch.no_grad():
        wte = swapped.get_input_embeddings().weight
        wte[[0, 1]] = wte[[1, 0]].clone()
    torch.manual_seed(3)
    on_swapped = finetune(add_lora(copy.deepcopy(swapped), alpha=16), tokenizer, pairs[:12],
                          checkpoint_path=checkpoint, **common)
    assert on_swapped["resumed_from_epoch"] is None
    torch.manual_seed(3)
    same = finetune(add_lora(copy.deepcopy(swapped), alpha=16), tokenizer, pairs[:12], checkpoint_path=checkpoint,
                    **common)
    assert same["resumed_from_epoch"] == 3  # the finished run's final checkpoint: nothing left to train


# ---------------------------------------------------------------------------
# The LoRA step: target-only loss, the shared TrainStep, half-precision base, batching


def _float64_lora(pretrained_tiny):
    model = add_lora(copy.deepcopy(pretrained_tiny), dropout=0.0).double()
    with torch.no_grad():  # non-zero B, so that the adapters change the output
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model.eval()


def test_target_loss_and_gradients_equal_the_full_logits_computation(tokenizer, pretrained_tiny, e2e_examples):
    from darel.nlg.lm import TargetLoss, collate_pairs, encode_pair_ids, target_positions
    from darel.nlg.lm.loss import _shifted_token_losses

    model = _float64_lora(pretrained_tiny)
    encoded = encode_pair_ids(tokenizer, training_pairs(e2e_examples)[:6], max_length=128)
    batch = collate_pairs(encoded, tokenizer.pad_token_id)
    positions, targets = target_positions(batch["labels"])
    assert len(targets) == int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    trainable = [p for p in model.parameters() if p.requires_grad]

    # straightforward: full logits (every position), per-position loss, masked sum
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert logits.dtype == torch.float64
    expected = _shifted_token_losses(logits, batch["labels"], 0.1).sum()
    expected_grads = torch.autograd.grad(expected, trainable)

    got = TargetLoss(model)(batch["input_ids"], batch["attention_mask"], positions, targets, 0.1)
    got_grads = torch.autograd.grad(got, trainable)
    assert got.dtype == torch.float64
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    for ours, reference in zip(got_grads, expected_grads):
        assert torch.allclose(ours, reference, rtol=1e-10, atol=1e-12)
    assert any(g.abs().sum() > 0 for g in got_grads)


def test_finetune_steps_through_the_shared_train_step(tokenizer, pretrained_tiny, e2e_examples, monkeypatch):
    from darel import step
    from darel.nlg import lm

    made = []

    class Recording(step.TrainStep):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls = 0
            made.append(self)

        def __call__(self, *args, **kwargs):
            self.calls += 1
            return super().__call__(*args, **kwargs)

    monkeypatch.setattr(lm.finetuning, "TrainStep", Recording)
    # The CPU memory count replays a few steps after the clock; counted in place instead,
    # every call of the step is a training step.
    model = add_lora(copy.deepcopy(pretrained_tiny))
    result = finetune(model, tokenizer, training_pairs(e2e_examples)[:20], epochs=1, batch_size=8, warmup_steps=0,
                      max_length=128, seed=0, progress=False, memory_count="in_place", **PROTOCOL)
    assert len(made) == 1 and made[0].calls == result["steps"] == 3
    assert made[0].precision == "fp32" and not made[0].scaler.is_enabled()


def test_frozen_base_is_held_in_the_autocast_dtype_on_a_gpu_only(pretrained_tiny):
    from darel.nlg.lm import hold_frozen_in_half

    model = add_lora(copy.deepcopy(pretrained_tiny))
    hold_frozen_in_half(model, "fp16", "cpu")  # a CPU always runs float32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # what a CUDA device gets (only the dtype logic runs here; the tensors stay on the CPU)
    hold_frozen_in_half(model, "bf16", "cuda")
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}


def test_next_batch_size_fills_the_memory_budget():
    from darel.nlg.lm import next_batch_size

    # 8 items took 800 MB above a 1000 MB base: 100 MB each; budget 3000 MB -> 20 fit,
    # but a chunk grows at most twofold, and never past what is left
    assert next_batch_size(8, 1000, 1800, 3000, 500) == 16
    assert next_batch_size(16, 1000, 2600, 3000, 500) == 20
    assert next_batch_size(16, 1000, 2600, 3000, 7) == 7
    assert next_batch_size(4, 1000, 5000, 3000, 100) == 2  # over budget: shrink
    assert next_batch_size(4, 1000, 9000, 1200, 100) == 1  # never below one


def test_outputs_and_losses_do_not_depend_on_the_batching(tokenizer, pretrained_tiny, e2e_examples):
    model = add_lora(copy.deepcopy(pretrained_tiny)).eval()
    prompts = [prompt_ids(tokenizer, example.source) for example in e2e_examples[:7]]
    decode = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, num_beams=4,
                  max_new_tokens=24, device="cpu")
    one = generate_ids(model, prompts, batch_size=1, **decode)
    assert generate_ids(model, prompts, batch_size=3, **decode) == one
    assert generate_ids(model, prompts, batch_size=7, memory_budget=1 << 30, **decode) == one
    pairs = training_pairs(e2e_examples)[:9]
    single = per_sample_lm_loss(model, tokenizer, pairs, batch_size=1, max_length=128)
    batched = per_sample_lm_loss(model, tokenizer, pairs, batch_size=9, max_length=128)
    assert np.allclose(single, batched, rtol=1e-5, atol=1e-6)


def _decoding_problem():
    """A tiny GPT-2 with random LoRA weights whose end-of-text token is likely enough that
    beams end at every length (so the length penalty, the finished pool and the stopping
    heuristic all decide outputs), and 16 random prompts of 3 to 11 tokens (left padding)."""
    vocab = 300
    eos, pad = vocab - 1, vocab - 2
    model = add_lora(build_lm(tiny_gpt2_config(vocab, eos_token_id=eos, pad_token_id=pad), seed=0), seed=0).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5, generator=gen)
        model.get_base_model().transformer.wte.weight[eos] *= 3  # tied head: a larger end-of-text logit
    prompts = [torch.randint(0, pad, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(16)]
    return model, prompts, dict(pad_token_id=pad, eos_token_id=eos, max_new_tokens=20, device="cpu")


@pytest.mark.parametrize("early_stopping", [False, True, "never"])
def test_the_batched_search_decodes_exactly_what_generate_decodes(early_stopping):
    """beam_search_ids against the reference decoder (Hugging Face generate) on fixed
    inputs, float32 on the CPU: greedy and beam search, with and without the n-gram ban,
    length penalties above, below and under zero, each decoder at other batchings, the
    stop checked every step or every fourth; outputs of every length from 0 to the limit."""
    torch.set_num_threads(1)
    model, prompts, ids = _decoding_problem()
    model.generation_config.early_stopping = early_stopping
    settings = [dict(num_beams=1, no_repeat_ngram_size=2), dict(num_beams=1, no_repeat_ngram_size=0),
                dict(num_beams=4, length_penalty=0.9, no_repeat_ngram_size=4),
                dict(num_beams=10, length_penalty=0.9, no_repeat_ngram_size=4),
                dict(num_beams=3, length_penalty=2.0, no_repeat_ngram_size=0),
                dict(num_beams=5, length_penalty=-0.5, no_repeat_ngram_size=1)]
    if early_stopping is not False:
        settings = settings[2:]  # early_stopping only changes beam search
    lengths = set()
    for setting in settings:
        reference = generate_ids(model, prompts, batch_size=3, **ids, **setting)
        for batch_size, check_every in ((16, 4), (5, 1)):
            assert beam_search_ids(model, prompts, batch_size=batch_size, check_every=check_every, **ids,
                                   **setting) == reference, (setting, batch_size)
        lengths.update(map(len, reference))
    assert {0, 1, ids["max_new_tokens"]} <= lengths and len(lengths) > 8


def test_the_batched_search_refuses_settings_it_does_not_apply():
    model, prompts, ids = _decoding_problem()
    model.generation_config.repetition_penalty = 1.3
    with pytest.raises(ValueError, match="repetition_penalty"):
        beam_search_ids(model, prompts, **ids)



def _left_padded(prompts, pad, copies):
    width = max(map(len, prompts))
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return input_ids.repeat_interleave(copies, 0), mask.repeat_interleave(copies, 0), width


@pytest.mark.parametrize("beams", [1, 3, 10])
def test_the_preallocated_cache_gives_the_growing_caches_logits_bit_for_bit(beams):
    """The batched search's model calls on the preallocated cache against transformers'
    DynamicCache (the growing cache), fed the same tokens and the same beam reorders
    (random parents within each source): every step's float32 logits are equal, so every
    score and every choice of the search is; 1, 5 and 16 sources per batch."""
    from darel.nlg.lm.decoding import _Rows

    torch.set_num_threads(1)
    model, prompts, ids = _decoding_problem()
    vocab, steps = ids["eos_token_id"] + 1, 12
    for sources in (1, 5, 16):
        input_ids, mask, width = _left_padded(prompts[:sources], ids["pad_token_id"], beams)
        rows = {cache: _Rows(model, input_ids, mask, copies=beams, max_length=width + steps, kv_cache=cache)
                for cache in ("growing", "preallocated")}
        gen = torch.Generator().manual_seed(sources)
        with torch.no_grad():
            logits = {cache: r.logits() for cache, r in rows.items()}
            for _ in range(steps - 1):
                assert torch.equal(logits["growing"], logits["preallocated"])
                tokens = torch.randint(0, vocab, (sources * beams,), generator=gen)
                parents = (torch.randint(0, beams, (sources, beams), generator=gen)
                           + torch.arange(sources)[:, None] * beams).view(-1)
                for cache, r in rows.items():
                    if beams > 1:
                        r.reorder(parents)
                    logits[cache] = r.logits(tokens)
        assert torch.equal(logits["growing"], logits["preallocated"])


@pytest.mark.parametrize("setting", [dict(num_beams=1, no_repeat_ngram_size=2),
                                     dict(num_beams=3, length_penalty=2.0, no_repeat_ngram_size=0),
                                     dict(num_beams=10, length_penalty=0.9, no_repeat_ngram_size=4)])
def test_both_caches_decode_what_generate_decodes_at_the_same_batch(setting):
    torch.set_num_threads(1)
    model, prompts, ids = _decoding_problem()
    lengths = set()
    for batch_size in (16, 5):
        reference = generate_ids(model, prompts, batch_size=batch_size, **ids, **setting)
        for kv_cache in ("growing", "preallocated"):
            assert beam_search_ids(model, prompts, batch_size=batch_size, kv_cache=kv_cache, **ids,
                                   **setting) == reference, (kv_cache, batch_size)
        lengths.update(map(len, reference))
    assert len(lengths) > 3  # outputs that end at different steps, not all cut at the limit


@pytest.mark.parametrize("beams", [1, 4])
def test_the_preallocated_cache_is_allocated_once_and_written_in_place(beams, monkeypatch):
    """Every key/value tensor the model attends over is a view of the buffers its layer
    allocated at the prefill (two per tensor with beams: the reorder's target, then the
    next step's source; one for greedy decoding), whose size never changes; the reorders
    copy only the positions after the prompt."""
    from darel.nlg.lm import decoding

    torch.set_num_threads(1)
    model, prompts, ids = _decoding_problem()
    seen: dict[int, list] = {}
    reorders = []
    update, reorder_cache = decoding._PreallocatedLayer.update, decoding._PreallocatedLayer.reorder_cache

    def spy_update(layer, key_states, value_states, *args, **kwargs):
        first = not layer.is_initialized
        keys, values = update(layer, key_states, value_states, *args, **kwargs)
        if first:
            buffers = [layer.key_buffer, layer.value_buffer, layer.spare_keys, layer.spare_values]
            buffers = [t for t in buffers if t is not None]
            seen[id(layer)] = [layer, {t.data_ptr() for t in buffers}, {t.untyped_storage().nbytes() for t in buffers},
                               [], key_states.shape[2]]
        seen[id(layer)][3].append((keys, values))
        return keys, values

    def spy_reorder(layer, beam_idx):
        reorders.append((layer, layer.shared_prefix, layer.length))
        reorder_cache(layer, beam_idx)

    monkeypatch.setattr(decoding._PreallocatedLayer, "update", spy_update)
    monkeypatch.setattr(decoding._PreallocatedLayer, "reorder_cache", spy_reorder)
    beam_search_ids(model, prompts, batch_size=6, num_beams=beams, **ids)

    assert len(seen) == 3 * 2  # three batches of a two-layer model
    for layer, buffers, sizes, attended, width in seen.values():
        assert len(buffers) == (2 if beams == 1 else 4) and len(sizes) == 1
        assert len(attended) > 2  # the prefill and at least two steps
        used = set()
        for keys, values in attended:
            for states in (keys, values):
                assert states.untyped_storage().data_ptr() in buffers
                assert states.untyped_storage().nbytes() in sizes
                used.add(states.untyped_storage().data_ptr())
        assert len(used) == len(buffers)  # with beams, both buffers of each tensor serve
        assert [keys.shape[2] for keys, _ in attended] == list(range(width, width + len(attended)))
    if beams == 1:
        assert not reorders
    else:
        assert reorders and all(0 < shared <= length for _, shared, length in reorders)
        assert all(shared == seen[id(layer)][4] for layer, shared, _ in reorders)


@pytest.mark.parametrize("equal_copies", [True, False])
def test_preallocated_layers_hold_what_dynamic_layers_hold(equal_copies):
    """Updates and beam reorders on the preallocated cache against transformers'
    DynamicCache on random states: equal after every operation, whether the prompt's
    copies are equal (reorders skip the prompt) or not (they copy it too)."""
    from transformers.cache_utils import Cache, DynamicCache

    from darel.nlg.lm.decoding import _PreallocatedLayer, _share_prompt

    gen = torch.Generator().manual_seed(0)
    sources, copies, heads, width, dim, steps = 3, 4, 2, 5, 3, 6
    preallocated = Cache(layers=[_PreallocatedLayer(width + steps, reorders=True) for _ in range(2)])
    dynamic = DynamicCache()

    def states(length, equal):
        if equal:
            return torch.randn(sources, 1, heads, length, dim, generator=gen).expand(
                -1, copies, -1, -1, -1).reshape(sources * copies, heads, length, dim)
        return torch.randn(sources * copies, heads, length, dim, generator=gen)

    for layer in range(2):
        keys, values = states(width, equal_copies), states(width, equal_copies)
        for cache in (preallocated, dynamic):
            cache.update(keys, values, layer)
    assert _share_prompt(preallocated, copies) is equal_copies
    assert all(layer.shared_prefix == (width if equal_copies else 0) for layer in preallocated.layers)
    for _ in range(steps):
        parents = (torch.randint(0, copies, (sources, copies), generator=gen)
                   + torch.arange(sources)[:, None] * copies).view(-1)
        for cache in (preallocated, dynamic):
            cache.reorder_cache(parents)
        for layer in range(2):
            keys, values = states(1, False), states(1, False)
            got = preallocated.update(keys, values, layer)
            want = dynamic.update(keys, values, layer)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert preallocated.get_seq_length() == dynamic.get_seq_length()
    with pytest.raises(ValueError, match="holds 11 positions"):
        preallocated.update(keys, values, 0)


def test_the_batched_search_names_an_unknown_cache():
    model, prompts, ids = _decoding_problem()
    with pytest.raises(ValueError, match="kv_cache must be one of .*'paged'"):
        beam_search_ids(model, prompts, kv_cache="paged", **ids)


# ---------------------------------------------------------------------------
# Settings derived from the data; a slice of real files in data/raw


def test_lengths_derived_from_the_data_fit_every_pair(tokenizer, e2e_examples):
    from darel.nlg.lm import derive_lengths, encode_pair_ids

    pairs = training_pairs(e2e_examples)
    sources = [example.source for example in e2e_examples[:10]]
    lengths = derive_lengths(tokenizer, pairs, sources, max_new_tokens=40)
    encoded = encode_pair_ids(tokenizer, pairs, lengths["max_length"])  # every pair fits
    assert lengths["max_length"] == max(len(ids) for ids, _ in encoded)
    longest_prompt = max(len(prompt_ids(tokenizer, s)) for s in sources)
    assert lengths["n_positions"] == max(lengths["max_length"], longest_prompt + 40)
    # one token less and the longest pair stops the run, naming it
    index = max(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    with pytest.raises(ValueError, match=rf"pair {index} \(source {re.escape(repr(pairs[index][0][:20]))[:-1]}"):
        encode_pair_ids(tokenizer, pairs, lengths["max_length"] - 1)


def test_vocab_size_from_the_data():
    from darel.nlg.tokenizer import SPECIAL_TOKENS, vocab_size_for

    texts = ["the cat sat", "the cat ran", "a dog"]  # the, cat seen twice
    assert vocab_size_for(texts, min_frequency=2) == 256 + len(SPECIAL_TOKENS) + 2
    assert vocab_size_for(texts, min_frequency=1) == 256 + len(SPECIAL_TOKENS) + 6
    assert vocab_size_for(texts, min_frequency=1, cap=262) == 262


def test_local_source_takes_a_labelled_slice_of_the_real_files(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    raw = tmp_path / "raw"
    params = json.dumps({"dataset": "e2e", "seed": 0, "synthetic": True, "source": "local", "n_train": 2,
                         "n_dev": 1, "n_test": 1})
    stage = [sys.executable, str(Path(__file__).resolve().parents[1] / "stages" / "nlg_data.py"), "--params",
             params, "--out-dir", str(tmp_path / "out"), "--raw", str(raw), "--no-progress"]
    proc = subprocess.run(stage, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and str(raw / "e2e" / "trainset.csv") in proc.stderr  # says what is missing
    (raw / "e2e").mkdir(parents=True)
    mrs = [f"name[Venue {k}], eatType[pub], area[riverside]" for k in range(4)]
    for name in ("trainset.csv", "devset.csv", "testset_w_refs.csv"):
        _write_e2e_csv(raw / "e2e" / name, [(mr, f"Venue {k} is a pub by the river.") for k, mr in enumerate(mrs)]
                       + [(mrs[0], "A riverside pub: Venue 0.")])
    proc = subprocess.run(stage, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["label"].startswith("SLICE of the real e2e data") and "quick profile" in meta["label"]
    assert (meta["n_train"], meta["n_dev"], meta["n_test"]) == (2, 1, 1)
    train = read_split(tmp_path / "out" / "train.jsonl")
    assert train[0] == NLGExample(mrs[0], ("Venue 0 is a pub by the river.", "A riverside pub: Venue 0."))
