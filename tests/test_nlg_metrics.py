"""Hand-checked cases for darel.nlg.metrics and the darel-nlg-metrics CLI (darel.nlg.metrics_cli)."""

import json
import math
import random
import shutil
from pathlib import Path

import pytest

from darel.nlg import metrics as M
from darel.nlg import metrics_cli

needs_java = pytest.mark.skipif(
    shutil.which("java") is None,
    reason="no `java` on PATH: METEOR 1.5 and the Stanford PTB tokeniser need Java 17+",
)

NIST_BETA = math.log(2) / math.log(1.5) ** 2


# --------------------------------------------------------------------------- #
# mteval-v13a tokenisation
# --------------------------------------------------------------------------- #
def test_mteval_tokenisation_rules():
    toks = M.mteval_tokenize("Hello, World! It's £20-25 (3.5 stars). &quot;ÉCOLE&quot; 1,000.")
    # only A-Z are lowercased (É stays), apostrophe is not split, '£' is not an
    # ASCII symbol, a dash after a digit is split, digits keep their '.' and ','
    assert toks == ["hello", ",", "world", "!", "it's", "£20", "-", "25", "(", "3.5", "stars", ")",
                    ".", '"', "École", '"', "1,000", "."]
    assert M.mteval_tokenize("a <skipped> b &amp; c&lt;d") == ["a", "b", "&", "c", "<", "d"]
    assert M.mteval_tokenize("Mixed Case", preserve_case=True) == ["Mixed", "Case"]
    assert M.mteval_normalize("end-\nof line") == "endof line"  # raw v13a rule
    assert M.mteval_tokenize("end-\nof line") == ["end-", "of", "line"]  # SGML reader collapses first


# --------------------------------------------------------------------------- #
# BLEU
# --------------------------------------------------------------------------- #
def test_bleu_exact_match_is_one():
    hyps = ["The cat sat on the mat .", "A dog barks at the old postman ."]
    refs = [[h] for h in hyps]
    assert M.bleu_nist(hyps, refs)["BLEU"] == pytest.approx(1.0, abs=1e-12)


def test_bleu_brevity_penalty_closest_reference():
    # hyp: 5 tokens, every n-gram is in ref A (6 tokens), precisions 5/5 4/4 3/3 2/2.
    # Reference lengths 6 and 3: closest to 5 is 6 -> BP = exp(1 - 6/5) = exp(-0.2)
    # = 0.8187307531 (the old "shortest" rule would pick 3 and give BLEU 1).
    hyp = ["the cat sat on the"]
    got = M.bleu_nist(hyp, [["the cat sat on the mat", "a cat sat"]])["BLEU"]
    assert got == pytest.approx(math.exp(-0.2), abs=1e-12)
    # lengths 6 and 4 are both 1 away from 5: the tie goes to the shorter (4),
    # c=5 > r=4 so BP = 1 and BLEU = 1.
    got = M.bleu_nist(hyp, [["the cat sat on the mat", "x y z w"]])["BLEU"]
    assert got == pytest.approx(1.0, abs=1e-12)


def test_bleu_multi_reference_clipping_per_order():
    # hyp "the cat sat on the mat" (6 tokens) vs A "the cat sat down", B "he sat on the mat"
    # 1-grams: 'the' x2 clipped to max(1, 1) = 1 -> the, cat, sat, on, mat = 5/6
    # 2-grams: the cat (A), cat sat (A), sat on (B), on the (B), the mat (B) = 5/5
    # 3-grams: the cat sat (A), sat on the (B), on the mat (B) = 3/4
    # 4-grams: sat on the mat (B) = 1/3
    # ref lengths 4, 5; closest to 6 is 5 < 6 -> BP = 1
    # BLEU = (5/6 * 1 * 3/4 * 1/3) ** (1/4) = (5/24) ** 0.25 = 0.6756000774
    got = M.bleu_nist(["the cat sat on the mat"], [["the cat sat down", "he sat on the mat"]])["BLEU"]
    assert got == pytest.approx((5 / 24) ** 0.25, abs=1e-12)
    # with either reference alone the score is lower
    for ref in ("the cat sat down", "he sat on the mat"):
        assert M.bleu_nist(["the cat sat on the mat"], [[ref]])["BLEU"] < got


def test_bleu_mteval_smoothing_of_a_zero_order():
    # same hyp vs A "the cat sat down", B "he is on the mat":
    # 5/6, 4/5 (the cat, cat sat, on the, the mat), 2/4 (the cat sat, on the mat), 0/3.
    # mteval-v13a's default bleu_score replaces the zero 4-gram precision by
    # 1 / (2 * 3): BLEU = (5/6 * 4/5 * 1/2 * 1/6) ** (1/4) = (1/18) ** 0.25 = 0.4854917717
    got = M.bleu_nist(["the cat sat on the mat"], [["the cat sat down", "he is on the mat"]])["BLEU"]
    assert got == pytest.approx((1 / 18) ** 0.25, abs=1e-12)


def _toy_corpus(n, n_refs, seed):
    rng = random.Random(seed)
    words = ("The Eagle Aromi Zizzi coffee shop restaurant serves Italian French food near the "
             "river in city centre cheap price range is a family friendly with rating of 5 out "
             "high it , .").split()

    def sentence():
        return " ".join(rng.choice(words) for _ in range(rng.randint(8, 16)))

    hyps, refs = [], []
    for _ in range(n):
        rs = [sentence() for _ in range(n_refs)]
        base = rs[0].split()
        # a hypothesis that shares long stretches with its first reference
        cut = rng.randint(2, len(base) - 2)
        hyps.append(" ".join(base[:cut] + [rng.choice(words)] + base[cut:]))
        refs.append(rs)
    return hyps, refs


@pytest.mark.parametrize("n_refs", [1, 3])
def test_bleu_agrees_with_sacrebleu_13a_lowercase(n_refs):
    sacrebleu = pytest.importorskip("sacrebleu")
    hyps, refs = _toy_corpus(40, n_refs, seed=n_refs)
    ours = M.bleu_nist(hyps, refs)["BLEU"]
    # ASCII text: sacrebleu's 13a tokeniser + lowercase == mteval v13a without -c;
    # both use the closest reference length with ties to the shorter one.
    bleu = sacrebleu.BLEU(tokenize="13a", lowercase=True, smooth_method="none")
    streams = [[rs[k] for rs in refs] for k in range(n_refs)]
    theirs = bleu.corpus_score(hyps, streams).score / 100.0
    assert ours == pytest.approx(theirs, abs=1e-6)
    assert 0.2 < ours < 1.0


# --------------------------------------------------------------------------- #
# NIST
# --------------------------------------------------------------------------- #
def _nist_lp(ratio):
    return math.exp(-NIST_BETA * math.log(ratio) ** 2)


def test_nist_reference_length_uses_mean_non_empty_reference_count():
    # instance 1: hyp "a b", refs "a b c", "a c"; instance 2: hyp "c", ref "c a".
    # Reference words: 7; counts a 3, b 1, c 3, "a b" 1.
    # info(a) = info(c) = log2(7/3), info(b) = log2(7), info("a b") = log2(3/1).
    # matched: 1-grams a, b (inst 1) and c (inst 2); 2-gram "a b" (inst 1)
    # sum = (2*log2(7/3) + log2(7)) / 3 test 1-grams + log2(3) / 1 test 2-gram = 3.3356761
    # Length penalty: mteval divides the reference words by the MEAN number of non-empty
    # references per segment, (2 + 1) / 2 = 1.5 (the E2E wrapper pads instance 2 with an
    # empty reference, which mteval does not count): 7 / 1.5 = 14/3 reference words
    # against 3 test words, ratio 9/14 -> exp(-beta * ln(9/14)**2) = 0.4390903.
    # NIST = 3.3356761 * 0.4390903 = 1.4646407; the official E2E scorer prints 1.4646.
    expected = ((2 * math.log2(7 / 3) + math.log2(7)) / 3 + math.log2(3)) * _nist_lp(9 / 14)
    got = M.bleu_nist(["a b", "c"], [["a b c", "a c"], ["c a"]])["NIST"]
    assert got == pytest.approx(expected, abs=1e-12)
    assert round(got, 4) == 1.4646


def test_nist_uneven_references_and_an_empty_output():
    # refs: ["the cat sat", "a cat sat down", "the cat"], ["dog"], ["a dog ran", "the dog ran fast"]
    # hyps: "the cat", "" (empty), "dog ran".
    # Reference words 17: the 3, cat 3, sat 2, a 2, down 1, dog 3, ran 2, fast 1;
    # "the cat" 2, "dog ran" 2. info(the) = info(cat) = info(dog) = log2(17/3),
    # info(ran) = log2(17/2), info("the cat") = log2(3/2), info("dog ran") = log2(3/2).
    # 1-grams: 4 test words, all matched: (3 log2(17/3) + log2(17/2)) / 4
    # 2-grams: 2 test bigrams, both matched: 2 log2(3/2) / 2
    # nsys = (3 + 1 + 2) / 3 = 2 -> 17 / 2 = 8.5 reference words against 4 test words.
    # NIST = 3.2337001 * exp(-beta ln(4/8.5)^2) = 0.2947146; the official scorer prints 0.2947.
    hyps = ["the cat", "", "dog ran"]
    refs = [["the cat sat", "a cat sat down", "the cat"], ["dog"], ["a dog ran", "the dog ran fast"]]
    expected = ((3 * math.log2(17 / 3) + math.log2(17 / 2)) / 4 + math.log2(3 / 2)) * _nist_lp(4 / 8.5)
    got = M.bleu_nist(hyps, refs)["NIST"]
    assert got == pytest.approx(expected, abs=1e-12)
    assert round(got, 4) == 0.2947


def test_nist_empty_reference_strings_do_not_count():
    # An explicit empty reference (what the E2E wrapper pads with) changes nothing: the
    # same corpus as above with instance 2 padded to two references.
    padded = M.bleu_nist(["a b", "c"], [["a b c", "a c"], ["c a", ""]])["NIST"]
    assert padded == pytest.approx(M.bleu_nist(["a b", "c"], [["a b c", "a c"], ["c a"]])["NIST"], abs=1e-12)
    # An instance whose references are all empty stops mteval with a division by zero.
    with pytest.raises(M.MetricError, match="instance 1: every reference is empty"):
        M.bleu_nist(["a b", "c"], [["a b c"], ["", "  "]])


def test_nist_sentavg_is_the_mean_of_mteval_segment_scores():
    # Segment NIST uses the segment's own non-empty reference count:
    # segment 1 ("a b" vs "a b c", "a c"): info as in the corpus (weights from all
    # references), 2 test words vs 5 / 2 = 2.5 reference words;
    # segment 2 ("c" vs "c a"): 1 test word vs 2 / 1 reference words.
    seg1 = ((math.log2(7 / 3) + math.log2(7)) / 2 + math.log2(3)) * _nist_lp(2 / 2.5)
    seg2 = math.log2(7 / 3) * _nist_lp(1 / 2)
    stats = M._mteval_all(["a b", "c"], [["a b c", "a c"], ["c a"]])[1]
    assert M._nist_sentavg(stats) == pytest.approx((seg1 + seg2) / 2, abs=1e-12)


E2E_SLICE = Path(__file__).parent / "data" / "e2e_dev_slice"
OFFICIAL = json.loads((E2E_SLICE / "official_scores.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("refs_file", ["refs.txt", "refs_single.txt"])
def test_bleu_nist_equal_the_official_scorer_on_real_e2e_references(refs_file):
    # 40 real E2E dev inputs, 4 to 43 references each (or one), outputs shorter and longer
    # than the references, one empty: the official scorer's printed figures (4 decimals).
    refs = metrics_cli.read_refs(E2E_SLICE / refs_file)
    hyps = metrics_cli.read_hyps(E2E_SLICE / "hyp.txt")
    got = M.bleu_nist(hyps, refs)
    for key in ("BLEU", "NIST"):
        assert round(got[key], 4) == OFFICIAL[refs_file][key], key


def test_nist_single_segment_and_perl_zero_quirk():
    # hyp "a b" vs ref "a b c": info(a) = info(b) = log2 3, info("a b") = 0
    # NIST = (2 log2 3) / 2 + 0 = log2 3, times LP(2/3) = 0.5
    got = M.bleu_nist(["a b"], [["a b c"]])["NIST"]
    assert got == pytest.approx(0.5 * math.log2(3), abs=1e-12)
    # mteval tests the prefix "0" for truth, so info("0 x") uses the total word
    # count: log2(2/1) = 1 instead of log2(1/1) = 0.
    assert M.bleu_nist(["0 x"], [["0 x"]])["NIST"] == pytest.approx(2.0, abs=1e-12)
    assert M.bleu_nist(["a x"], [["a x"]])["NIST"] == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------- #
# ROUGE-L and CIDEr (on already tokenised text)
# --------------------------------------------------------------------------- #
def test_rouge_l_hand_computed():
    # LCS("the cat sat on the mat", "the cat was on the red mat") = the cat on the mat = 5
    # P = 5/6, R = 5/7, F = (1 + 1.2^2) P R / (R + 1.2^2 P)
    p, r = 5 / 6, 5 / 7
    f = 2.44 * p * r / (r + 1.44 * p)
    got = M.rouge_l(["the cat sat on the mat"], [["the cat was on the red mat"]], tokenize=False)
    assert got == pytest.approx(f, abs=1e-12)
    # precision and recall are maximised separately over references:
    # the extra ref "cat" gives R = 1/1, so F = 2.44 * (5/6) / (1 + 1.44 * 5/6)
    got = M.rouge_l(["the cat sat on the mat"], [["the cat was on the red mat", "cat"]], tokenize=False)
    assert got == pytest.approx(2.44 * p / (1 + 1.44 * p), abs=1e-12)


def test_cider_identity_value_and_ordering():
    refs = [["alpha beta gamma delta epsilon"], ["one two three four five"]]
    hyps = [rs[0] for rs in refs]
    # n-grams of each instance occur in 1 of 2 instances: idf = log 2 > 0, every
    # clipped cosine is 1, no length penalty -> 10 x mean(1, 1, 1, 1) = 10 exactly
    assert M.cider(hyps, refs, tokenize=False) == pytest.approx(10.0, abs=1e-12)
    worse = ["alpha beta zeta delta epsilon", "one two three four five"]
    assert M.cider(worse, refs, tokenize=False) < 10.0
    # a one-instance corpus: idf = log 1 - log 1 = 0 everywhere, CIDEr is 0
    assert M.cider(hyps[:1], refs[:1], tokenize=False) == 0.0


def test_rouge_and_cider_match_pycocoevalcap():
    pytest.importorskip("pycocoevalcap")
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    hyps, refs = _toy_corpus(30, 3, seed=7)
    hyps = [h.lower() for h in hyps]
    refs = [[r.lower() for r in rs] for rs in refs]
    hyps[3] = "eagle"  # one-token hypothesis (no bigrams)
    gts = {i: rs for i, rs in enumerate(refs)}
    res = {i: [h] for i, h in enumerate(hyps)}
    assert M.rouge_l(hyps, refs, tokenize=False) == pytest.approx(Rouge().compute_score(gts, res)[0], abs=1e-12)
    assert M.cider(hyps, refs, tokenize=False) == pytest.approx(Cider().compute_score(gts, res)[0], abs=1e-9)


# --------------------------------------------------------------------------- #
# TER
# --------------------------------------------------------------------------- #
def test_ter_percent_and_uneven_references():
    assert M.ter(["a b c d"], [["a b c e"]]) == pytest.approx(25.0)
    # one reference matches exactly -> 0 edits (fewest edits over references)
    assert M.ter(["a b c", "x y"], [["a b c", "q"], ["x y"]]) == pytest.approx(0.0)
    # a shift: "c a b" -> "a b c" is one block move of "a b" (1 edit over 3 words)
    assert M.ter(["c a b"], [["a b c"]]) == pytest.approx(100 / 3)


def _sacrebleu_ter(hyps, refs):
    from sacrebleu.metrics import TER

    width = max(len(rs) for rs in refs)
    streams = [[rs[k] if k < len(rs) else None for rs in refs] for k in range(width)]
    return TER().corpus_score(list(hyps), streams).score


def _ter_corpus(seed):
    # Long, repetitive segments over a small vocabulary: many shift candidates (the
    # 1000-candidate cap is reached), distances beyond the beam (the beam programme
    # runs), empty hypotheses and references, mixed case, several references.
    rng = random.Random(seed)
    vocab = "a b c d e f The the , .".split()

    def sentence(n):
        return " ".join(rng.choice(vocab) for _ in range(n))

    hyps, refs = [], []
    for _ in range(14):
        hyps.append(sentence(rng.choice([0, 1, 4, 12, 30, 80])))
        refs.append([sentence(rng.choice([0, 3, 12, 28, 70])) for _ in range(rng.randint(1, 3))])
    return hyps, refs


def test_ter_equals_sacrebleu_exactly(monkeypatch):
    from sacrebleu.metrics.lib_ter import translation_edit_rate

    from darel.nlg import ter as T

    hyps, refs = _ter_corpus(seed=3)
    reached = {"cap": 0, "beam": 0}
    best_shift, programme = T._best_shift, T._beam_programme

    def counting_shift(*args):
        out = best_shift(*args)
        reached["cap"] += out[2] >= T._MAX_CANDIDATES
        return out

    def counting_programme(hyp, ref, with_trace):
        reached["beam"] += not with_trace
        return programme(hyp, ref, with_trace)

    monkeypatch.setattr(T, "_best_shift", counting_shift)
    monkeypatch.setattr(T, "_beam_programme", counting_programme)
    assert M.ter(hyps, refs) == _sacrebleu_ter(hyps, refs)  # bit for bit
    assert reached["cap"] > 0 and reached["beam"] > 0  # both rare paths were exercised
    # per pair: every reference that is not skipped gets sacrebleu's edit count, and a
    # skipped one has at least the fewest edits
    for hyp, rs in zip(hyps, refs):
        words = T.ter_tokens(hyp)
        edits = T.segment_edits(words, [T.ter_tokens(r) for r in rs])
        theirs = [translation_edit_rate(words, T.ter_tokens(r))[0] for r in rs]
        assert min(e for e in edits if e is not None) == min(theirs)
        for ours, exact in zip(edits, theirs):
            assert ours is None or ours == exact


def test_ter_on_real_e2e_references_and_in_worker_processes():
    refs = metrics_cli.read_refs(E2E_SLICE / "refs.txt")
    hyps = metrics_cli.read_hyps(E2E_SLICE / "hyp.txt")
    expected = _sacrebleu_ter(hyps, refs)
    assert M.ter(hyps, refs) == expected
    done = []
    assert M.ter(hyps, refs, workers=2, progress=done.append) == expected
    assert sum(done) == len(hyps)


def test_input_validation():
    with pytest.raises(M.MetricError, match="2 hypotheses but 1"):
        M.bleu_nist(["a", "b"], [["a"]])
    with pytest.raises(M.MetricError, match="no references"):
        M.bleu_nist(["a"], [[]])
    with pytest.raises(M.MetricError, match="no hypotheses"):
        M.ter([], [])


# --------------------------------------------------------------------------- #
# Java: PTB tokeniser and METEOR 1.5
# --------------------------------------------------------------------------- #
def test_missing_java_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(M.MetricError, match="Java .*17"):
        M.meteor(["a b"], [["a b"]])
    with pytest.raises(M.MetricError, match="apt-get install openjdk-17"):
        M.rouge_l(["a b"], [["a b"]])


@needs_java
def test_ptb_tokenisation_as_the_e2e_scorer():
    out = M.ptb_tokenize(["The Eagle (cheap) costs £20, isn't it?", "", "Fine."])
    # lowercased, '£' becomes '#', contractions split, punctuation tokens dropped;
    # the lowercased bracket tokens survive the scorer's filter
    assert out == ["the eagle -lrb- cheap -rrb- costs # 20 is n't it", "", "fine"]


@needs_java
def test_meteor_identical_and_scrambled():
    ref = "the cat sat on the mat near the river bank"
    scrambled = "mat the on sat cat the river near bank the"
    same = M.meteor([ref], [[ref]])
    worse = M.meteor([scrambled], [[ref]])
    assert same == pytest.approx(1.0, abs=1e-6)
    assert 0.0 < worse < same - 0.3


@needs_java
def test_score_all_equals_the_official_scorer_on_real_e2e_references():
    refs = metrics_cli.read_refs(E2E_SLICE / "refs.txt")
    hyps = metrics_cli.read_hyps(E2E_SLICE / "hyp.txt")
    got = M.score_all(hyps, refs, variants=True)
    for key in ("BLEU", "NIST", "METEOR", "ROUGE_L", "CIDEr"):
        assert round(got[key], 4) == OFFICIAL["refs.txt"][key], key
    assert round(got["NIST_sentavg"], 4) == OFFICIAL["refs.txt"]["NIST_segment_mean"]
    assert got["TER"] == _sacrebleu_ter(hyps, refs)


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #
REFS_TEXT = (
    "The Eagle is a cheap coffee shop near Burger King.\n"
    "Near Burger King, The Eagle is a cheap coffee shop.\n"
    "\n"
    "Aromi is a family-friendly Italian restaurant in the city centre.\n"
    "\n"
    "Zizzi serves French food by the river.\n"
    "By the river, Zizzi serves French food.\n"
    "Zizzi is a French place at the riverside.\n"
)
HYP_TEXT = (
    "The Eagle is a cheap coffee shop near Burger King.\n"
    "Aromi is an Italian restaurant in the city centre.\n"
    "Zizzi serves French food by the river.\n"
)


def _write(tmp_path, name, content):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return p


@needs_java
def test_cli_happy_path(tmp_path, capsys):
    refs = _write(tmp_path, "refs.txt", REFS_TEXT)
    hyp = _write(tmp_path, "hyp.txt", HYP_TEXT)
    assert metrics_cli.main(["--refs", str(refs), "--hyp", str(hyp)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(M.METRIC_KEYS)
    assert 0.5 < out["BLEU"] <= 1.0 and 0.0 <= out["TER"] < 50
    assert metrics_cli.main(["--refs", str(refs), "--hyp", str(hyp), "--variants"]) == 0
    captured = capsys.readouterr()
    out2 = json.loads(captured.out)
    assert list(out2) == list(M.METRIC_KEYS) + list(M.VARIANT_KEYS)
    assert captured.out.count("\n") == 1
    assert out2["METEOR_sentavg_x100"] > 0 and out2["METEOR_nltk_exact_x100"] > 0


@needs_java
def test_cli_empty_hypothesis_line_is_allowed(tmp_path, capsys):
    refs = _write(tmp_path, "refs.txt", REFS_TEXT)
    hyp = _write(tmp_path, "hyp.txt", "The Eagle is a cheap coffee shop.\n\nZizzi serves French food.\n")
    assert metrics_cli.main(["--refs", str(refs), "--hyp", str(hyp)]) == 0
    assert set(json.loads(capsys.readouterr().out)) == set(M.METRIC_KEYS)


def _run_error(args, capsys):
    rc = metrics_cli.main(args)
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    return captured.err


def test_cli_count_mismatch(tmp_path, capsys):
    refs = _write(tmp_path, "refs.txt", REFS_TEXT)
    hyp = _write(tmp_path, "hyp.txt", "only one line\nand two\n")
    err = _run_error(["--refs", str(refs), "--hyp", str(hyp)], capsys)
    assert "3 reference instances" in err and "2 hypothesis lines" in err
    assert str(refs) in err and str(hyp) in err


def test_cli_empty_hypothesis_file(tmp_path, capsys):
    refs = _write(tmp_path, "refs.txt", REFS_TEXT)
    hyp = _write(tmp_path, "hyp.txt", "")
    err = _run_error(["--refs", str(refs), "--hyp", str(hyp)], capsys)
    assert str(hyp) in err and "empty" in err


def test_cli_non_utf8_line(tmp_path, capsys):
    refs = _write(tmp_path, "refs.txt", REFS_TEXT)
    hyp = _write(tmp_path, "hyp.txt", b"fine\nalso fine\ncaf\xe9 latin-1\n")
    err = _run_error(["--refs", str(refs), "--hyp", str(hyp)], capsys)
    assert f"{hyp}: line 3: not valid UTF-8" in err
    bad_refs = _write(tmp_path, "bad_refs.txt", b"ok\n\n\xff\xfe\n")
    err = _run_error(["--refs", str(bad_refs), "--hyp", str(hyp)], capsys)
    assert f"{bad_refs}: line 3: not valid UTF-8" in err


def test_cli_missing_file(tmp_path, capsys):
    hyp = _write(tmp_path, "hyp.txt", HYP_TEXT)
    missing = tmp_path / "nope.txt"
    err = _run_error(["--refs", str(missing), "--hyp", str(hyp)], capsys)
    assert f"{missing}: file not found" in err


def test_cli_instance_without_references(tmp_path, capsys):
    refs = _write(tmp_path, "refs.txt", "a ref\n\n\nanother ref\n")
    hyp = _write(tmp_path, "hyp.txt", "x\ny\n")
    err = _run_error(["--refs", str(refs), "--hyp", str(hyp)], capsys)
    assert f"{refs}: line 3:" in err and "no references" in err


def test_read_refs_formats(tmp_path):
    multi = _write(tmp_path, "m.txt", "a\nb\n\nc\n\n\n")
    assert metrics_cli.read_refs(multi) == [["a", "b"], ["c"]]  # trailing empty lines ignored
    single = _write(tmp_path, "s.txt", "\ufeffa\n  b  \nc")
    assert metrics_cli.read_refs(single) == [["a"], ["b"], ["c"]]  # no empty line: one ref each
    assert metrics_cli.read_hyps(_write(tmp_path, "h.txt", "x\n\ny\n")) == ["x", "", "y"]
