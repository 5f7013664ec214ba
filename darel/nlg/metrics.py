"""Language-generation metrics of the E2E NLG Challenge, re-implemented.

The official E2E scorer (``measure_scores.py`` of the e2e-metrics project) runs
two external tool chains and this module reproduces both:

* **BLEU and NIST**: the Perl script ``mteval-v13a-sig.pl`` (NIST mteval v13a
  with Kevin Gimpel's statistics dump), called *without* ``-c`` and without
  ``--no-smoothing``/``--brevity-penalty``.  What that means, read from the Perl
  source:

  - text is normalised by the v13a ``tokenization`` routine: ``<skipped>``
    tags dropped, end-of-line hyphens joined, ``&quot; &amp; &lt; &gt;``
    decoded, the ASCII letters A-Z lowercased (``tr/[A-Z]/[a-z]/``: no other
    letter is touched), then punctuation/symbols split off, periods and
    commas split unless next to a digit, a dash after a digit split.  Before
    that, the SGML reader has already collapsed every whitespace run to one
    space, so in the E2E pipeline the hyphenated-line-end rule never fires;
    :func:`bleu_nist` follows the pipeline order.
  - BLEU-4 brevity penalty uses the **closest** reference length per segment
    (``brevity_penalty_closest``, the v13 default); on a tie the **shorter**
    length wins; a zero-length reference is ignored unless it is the first
    one.  The corpus BLEU is ``bleu_score`` (the default, "smoothed" routine):
    a zero match count for order *k* is replaced by ``1 / (2**j * count)``
    (``j`` = how many zero orders so far), an order with no test n-grams at
    all contributes precision 1, and an empty test corpus scores 0.  On any
    real corpus no count is zero, so this is plain corpus BLEU.
  - NIST-5: information weights ``-log2(count(w1..wn) / count(w1..wn-1))``
    (unigrams: over the total reference word count) from all references of
    the evaluated set; test n-grams are clipped by the per-n-gram maximum over
    the segment's references; score = sum over n=1..5 of information of the
    matched n-grams / number of test n-grams, times the length penalty
    ``exp(-beta * log(ratio)**2)`` for ratio < 1 (``beta = -log 0.5 /
    log(1.5)**2``: a test set 2/3 as long as the references gets 0.5) on
    ``ratio = test words / (reference words / nsys)``.  ``nsys`` is the mean
    number of *non-empty* references per segment: mteval counts, per segment,
    the references whose tokenised text is not empty (``$nrefs++ if ($ref_seg
    ne '')``) and divides their sum by the number of segments
    (``$cum_ref_count / $cum_seg_count``).  The empty strings with which the
    E2E wrapper pads instances that have fewer references than the largest
    instance therefore count for nothing.  A segment whose references are all
    empty makes mteval stop with a division by zero (its segment-level NIST
    divides by that segment's count), so it is an error here too, naming the
    instance.  A Perl quirk is kept: an n-gram whose prefix is the single
    token ``0`` (false in Perl) is weighted against the total word count
    instead of the prefix count.
  - the scores are returned unrounded (``measure_scores.py`` prints 4
    decimals): BLEU on the 0-1 scale, NIST raw.

* **METEOR, ROUGE-L, CIDEr**: the MS-COCO caption evaluation code.  Every
  hypothesis and reference first goes through the Stanford PTBTokenizer
  (``stanford-corenlp-3.4.1.jar``, ``-preserveLines -lowerCase``), then the
  tokens ``'' ' `` ` -LRB- -RRB- -LCB- -RCB- . ? ! , : - -- ... ;`` are
  dropped.  (The tokenizer lowercases ``-LRB-`` to ``-lrb-``, so bracket
  tokens survive the filter; PTB also rewrites ``£`` as ``#``.)  We run the
  very same jar (Java needed), shipped inside the ``pycocoevalcap`` package.

  - METEOR 1.5: ``java -Xmx2G -jar meteor-1.5.jar - - -stdio -l en -norm``;
    one ``SCORE ||| ref1 ||| ... ||| hyp`` line per instance, then one
    ``EVAL ||| stats ...`` line; the corpus score is the jar's aggregate
    (last line), not the mean of segment scores.  Scale 0-1.
  - ROUGE-L: per instance, LCS against each reference on ``split(" ")``
    tokens, precision and recall maximised *separately* over references,
    F with beta = 1.2; corpus = mean over instances.  Scale 0-1.
  - CIDEr (pycocoevalcap's ``Cider``, i.e. CIDEr-D): 1..4-grams, tf-idf with
    document frequencies counted over the instances' reference sets of the
    evaluated corpus, idf ``log(N) - log(max(1, df))``; per order the
    clipped cosine ``sum min(h, r) * r / (|h| |r|)`` times the Gaussian length
    penalty ``exp(-delta**2 / (2 * 6**2))``, averaged over orders and over
    references, times 10; corpus = mean over instances.  As in the original,
    the "length" in ``delta`` is the number of *bigrams* (a known quirk), and
    a zero norm leaves that order's similarity at 0 (the installed
    pycocoevalcap guard; older copies divided 0 by 0).  Consequences: a
    one-instance corpus always scores 0 (every idf is log 1 - log 1 = 0); a
    hypothesis equal to its single reference scores 10 when its n-grams are
    not shared by all instances.

* **TER**: sacrebleu's ``TER()`` with its defaults (case-insensitive, no
  normalisation, no punctuation removal, Tercom-style shifts), multi-reference
  (fewest edits over the references / mean reference length), on raw text.
  Scale: percent (sacrebleu's number, e.g. 45.2 means 0.452).  Computed by
  :mod:`darel.nlg.ter`, which gives sacrebleu's values exactly in a fraction of
  its time on many references.

Paper-scale variants (``score_all(..., variants=True)``)
--------------------------------------------------------
The DAREL paper's E2E table pairs BLEU 65-70 (which matches the official
scorer's BLEU x 100) with METEOR 73-82 and NIST 5.9-7.3.  The official scorer
gives METEOR about 0.45-0.47 and NIST about 8.5-8.9 for GPT-2 + LoRA systems of
that BLEU (LoRA paper, Table 3: BLEU 70.4, NIST 8.85, METEOR 46.8), so those
two columns came from other code.  We ship the candidates we can compute
without extra downloads; none of them could be checked against the paper's
outputs (no E2E system outputs or data are available here), so treat the
attributions as hypotheses:

``METEOR_nltk_exact_x100``
    The Hugging Face ``evaluate`` "meteor" metric is NLTK's ``meteor_score``
    (alpha 0.9, beta 3, gamma 0.5; best reference per sentence; *mean of
    sentence scores*) on ``word_tokenize`` tokens, x100 when tabulated.  Its
    mild fragmentation penalty (beta 3 vs METEOR 1.5's 0.2 with gamma 0.6)
    puts good E2E outputs in the 0.7-0.8 range, so this is the **most
    plausible source of the paper's METEOR column** (moderate confidence: it
    is the usual metric of HF-based fine-tuning scripts and the only common
    METEOR implementation known to give such numbers).  NLTK's matcher uses
    exact, Porter-stem and WordNet-synonym stages; WordNet cannot be
    downloaded here and NLTK is not installed, so this variant implements the
    NLTK alignment and formula with the **exact stage only**, on PTB tokens
    (punctuation kept, lowercased).  Expect it to sit slightly *below* the HF
    number (fewer matches).  With ``nltk`` and its WordNet data (or Debian's
    ``wordnet-base``) one could reproduce HF exactly; not done here.
``METEOR_sentavg_x100``
    METEOR 1.5 (the jar) per-segment scores averaged, x100.  Included to rule
    sentence averaging out: on our synthetic E2E-like corpus (600 instances,
    about 3 references) it gave 40.2 against an official METEOR of 0.375,
    i.e. it stays within a few points of the official METEOR x100.
``NIST_nltk``
    NLTK's ``corpus_nist`` (what HF ``evaluate``'s "nist_mt" calls) on the
    v13a tokens, case kept (that metric's default ``lowercase=False``): per
    sentence and per order it keeps the *single best reference* instead of
    clipping against the union of references, which lowers NIST
    substantially on multi-reference instances.  **Plausible source of the
    paper's NIST column** (low-to-moderate confidence).

Measured on the synthetic corpus only (not real E2E outputs): official
METEOR 0.375 / NIST 7.13 / BLEU 0.679 came with METEOR_nltk_exact_x100 63.8
and NIST_nltk 5.57 (NIST_sentavg 6.03).  The ratios (NIST_nltk / NIST about
0.78) point the same way as the paper's columns, but the synthetic text is
not E2E data, so this is a direction, not a confirmation.
``NIST_sentavg``
    mteval-v13a segment-level NIST averaged over segments: the same
    information weights as the corpus score, and per segment the length
    penalty mteval computes for it (that segment's test words against its
    reference words / its number of non-empty references).

Everything is I/O-free apart from the two Java helpers (PTBTokenizer, METEOR);
a missing ``java`` raises :class:`MetricError` with installation advice.
"""

from __future__ import annotations

import atexit
import importlib.util
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Sequence

from darel.nlg.ter import corpus_ter

__all__ = [
    "MetricError",
    "METRIC_KEYS",
    "VARIANT_KEYS",
    "mteval_normalize",
    "mteval_tokenize",
    "bleu_nist",
    "ptb_tokenize",
    "meteor",
    "rouge_l",
    "cider",
    "ter",
    "score_all",
    "close_java_helpers",
]

METRIC_KEYS = ("BLEU", "NIST", "METEOR", "ROUGE_L", "CIDEr", "TER")
VARIANT_KEYS = ("METEOR_nltk_exact_x100", "METEOR_sentavg_x100", "NIST_nltk", "NIST_sentavg")


class MetricError(ValueError):
    """Bad metric input, or a helper (Java, a jar) that is missing or failed."""


# --------------------------------------------------------------------------- #
# input checks
# --------------------------------------------------------------------------- #
def _check_inputs(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if isinstance(hyps, str) or not isinstance(hyps, Sequence):
        raise MetricError("hyps must be a list of strings")
    if isinstance(refs, str) or not isinstance(refs, Sequence):
        raise MetricError("refs must be a list of lists of strings")
    if len(hyps) != len(refs):
        raise MetricError(f"{len(hyps)} hypotheses but {len(refs)} reference sets")
    if not hyps:
        raise MetricError("no hypotheses to score")
    for i, (h, rs) in enumerate(zip(hyps, refs)):
        if not isinstance(h, str):
            raise MetricError(f"hypothesis {i} is {type(h).__name__}, not str")
        if isinstance(rs, str) or not isinstance(rs, Sequence):
            raise MetricError(f"references of instance {i} must be a list of strings")
        if len(rs) == 0:
            raise MetricError(f"instance {i} has no references")
        for r in rs:
            if not isinstance(r, str):
                raise MetricError(f"a reference of instance {i} is {type(r).__name__}, not str")


# --------------------------------------------------------------------------- #
# mteval-v13a tokenisation
# --------------------------------------------------------------------------- #
# Perl's \s on character strings (not Python's, which also takes \x1c-\x1f).
_PERL_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_SPACE_RUN = re.compile(f"[{_PERL_SPACE}]+")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
# the v13a symbol class: { | } ~  [ \ ] ^ _ `  space ! " # $ % &  ( ) * +  : ; < = > ? @  /
_SYMBOL = re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])")
_PERIOD_COMMA_AFTER_NONDIGIT = re.compile(r"([^0-9])([\.,])")
_PERIOD_COMMA_BEFORE_NONDIGIT = re.compile(r"([\.,])([^0-9])")
_DASH_AFTER_DIGIT = re.compile(r"([0-9])(-)")


def mteval_normalize(text: str, preserve_case: bool = False) -> str:
    """The v13a ``tokenization`` routine on one segment (returns a spaced string)."""
    t = text.replace("<skipped>", "")
    t = t.replace("-\n", "").replace("\n", " ")
    t = t.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    t = f" {t} "
    if not preserve_case:
        t = t.translate(_ASCII_LOWER)
    t = _SYMBOL.sub(r" \1 ", t)
    t = _PERIOD_COMMA_AFTER_NONDIGIT.sub(r"\1 \2 ", t)
    t = _PERIOD_COMMA_BEFORE_NONDIGIT.sub(r" \1 \2", t)
    t = _DASH_AFTER_DIGIT.sub(r"\1 \2 ", t)
    t = _SPACE_RUN.sub(" ", t)
    return t.strip(" ")  # every whitespace run is a single space by now


def mteval_tokenize(text: str, preserve_case: bool = False) -> list[str]:
    """Tokens of one segment as the E2E scorer's mteval run sees them.

    The SGML reader first turns every whitespace run into one space (so the
    hyphenated-line-end rule cannot fire), then v13a normalisation applies.
    """
    norm = mteval_normalize(_SPACE_RUN.sub(" ", text), preserve_case=preserve_case)
    return [w for w in _SPACE_RUN.split(norm) if w]


# --------------------------------------------------------------------------- #
# BLEU / NIST (mteval-v13a, as run by the E2E scorer)
# --------------------------------------------------------------------------- #
_BLEU_N = 4
_NIST_N = 5
_NIST_BETA = -math.log(0.5) / math.log(1.5) / math.log(1.5)


def _ngram_counter(tokens: Sequence[str], n_max: int) -> Counter:
    counts: Counter = Counter()
    length = len(tokens)
    for n in range(1, n_max + 1):
        for i in range(length - n + 1):
            counts[tuple(tokens[i:i + n])] += 1
    return counts


def _nist_length_penalty(ratio: float) -> float:
    if ratio >= 1:
        return 1.0
    if ratio <= 0:
        return 0.0
    return math.exp(-_NIST_BETA * math.log(ratio) ** 2)


def _closest_ref_length(hyp_len: int, ref_lens: Sequence[int]) -> int:
    """v13a ``brevity_penalty_closest`` folded over the references in order."""
    best = ref_lens[0]
    for r in ref_lens[1:]:
        if r == 0:  # an empty (padding) reference never replaces the current one
            continue
        d_new, d_cur = abs(hyp_len - r), abs(hyp_len - best)
        if d_new < d_cur or (d_new == d_cur and r < best):
            best = r
    return best


def _information_weights(ref_tokens: list[list[list[str]]], n_max: int) -> dict:
    counts: Counter = Counter()
    total_words = 0
    for rs in ref_tokens:
        for toks in rs:
            total_words += len(toks)
            counts.update(_ngram_counter(toks, n_max))
    info = {}
    for gram, c in counts.items():
        prefix = gram[:-1]
        # Perl tests the joined prefix for truth: "" and "0" are both false.
        if prefix and prefix != ("0",):
            denom = counts[prefix]
        else:
            denom = total_words
        info[gram] = -math.log(c / denom) / math.log(2)
    return info


class _MtevalStats:
    """Per-segment and summed mteval statistics."""

    def __init__(self, n_max: int):
        self.n_max = n_max
        self.ref_length = 0
        self.match = [0] * (n_max + 1)
        self.tst = [0] * (n_max + 1)
        self.tst_info = [0.0] * (n_max + 1)
        self.ref_words = 0
        self.nonempty_refs = 0  # mteval's $nrefs: references not empty after tokenisation

    def add(self, other: "_MtevalStats") -> None:
        self.ref_length += other.ref_length
        self.ref_words += other.ref_words
        self.nonempty_refs += other.nonempty_refs
        for n in range(1, self.n_max + 1):
            self.match[n] += other.match[n]
            self.tst[n] += other.tst[n]
            self.tst_info[n] += other.tst_info[n]


def _segment_stats(hyp: list[str], refs: list[list[str]], info: dict, n_max: int) -> _MtevalStats:
    st = _MtevalStats(n_max)
    hyp_counts = _ngram_counter(hyp, n_max)
    ref_max: dict = {}
    for toks in refs:
        for gram, c in _ngram_counter(toks, n_max).items():
            if c > ref_max.get(gram, 0):
                ref_max[gram] = c
        st.ref_words += len(toks)
        st.nonempty_refs += bool(toks)
    st.ref_length = _closest_ref_length(len(hyp), [len(t) for t in refs])
    for n in range(1, n_max + 1):
        st.tst[n] = max(len(hyp) - n + 1, 0)
    for gram, c in hyp_counts.items():
        r = ref_max.get(gram)
        if r is None:
            continue
        clipped = min(c, r)
        n = len(gram)
        st.match[n] += clipped
        st.tst_info[n] += info[gram] * clipped
    return st


def _mteval_bleu(st: _MtevalStats) -> float:
    """v13a ``bleu_score`` (the default, smoothed routine), cumulative 4-gram."""
    if st.tst[1] > 0:
        bp = math.exp(min(0.0, 1.0 - st.ref_length / st.tst[1]))
    else:
        bp = 0.0
    log_sum = 0.0
    halvings = 1
    for n in range(1, _BLEU_N + 1):
        if st.tst[n] == 0:
            term = 0.0
        elif st.match[n] == 0:
            halvings *= 2
            term = math.log(1.0 / (halvings * st.tst[n]))
        else:
            term = math.log(st.match[n] / st.tst[n])
        log_sum += term
    return math.exp(log_sum / _BLEU_N) * bp


def _nist_info_sum(st: _MtevalStats) -> float:
    return sum(st.tst_info[n] / max(st.tst[n], 1) for n in range(1, _NIST_N + 1))


def _mteval_nist(st: _MtevalStats, segments: int) -> float:
    """v13a ``nist_score`` of summed statistics over ``segments`` segments: the
    reference length is the reference words divided by the mean number of non-empty
    references per segment."""
    nsys = st.nonempty_refs / segments
    return _nist_info_sum(st) * _nist_length_penalty(st.tst[1] / (st.ref_words / nsys))


def _mteval_all(hyps, refs, preserve_case=False):
    hyp_tok = [mteval_tokenize(h, preserve_case) for h in hyps]
    ref_tok = [[mteval_tokenize(r, preserve_case) for r in rs] for rs in refs]
    for i, rs in enumerate(ref_tok):
        if not any(rs):
            raise MetricError(
                f"instance {i}: every reference is empty after mteval tokenisation ({refs[i]!r}); "
                "mteval-v13a, and with it the official E2E scorer, stops with a division by zero on such "
                "an instance")
    n_max = max(_BLEU_N, _NIST_N)
    info = _information_weights(ref_tok, n_max)
    segs = [_segment_stats(h, rs, info, n_max) for h, rs in zip(hyp_tok, ref_tok)]
    total = _MtevalStats(n_max)
    for s in segs:
        total.add(s)
    return total, segs, hyp_tok, ref_tok


def bleu_nist(hyps: Sequence[str], refs: Sequence[Sequence[str]], *,
              preserve_case: bool = False) -> dict:
    """Corpus BLEU-4 (0-1) and NIST-5 exactly as mteval-v13a inside the E2E scorer.

    ``refs[i]`` lists the references of instance ``i`` (any number >= 1).
    ``preserve_case=True`` mimics ``mteval -c`` (the E2E scorer does not use it).
    Returns ``{"BLEU": float, "NIST": float}``, unrounded.
    """
    _check_inputs(hyps, refs)
    total, segs, _h, _r = _mteval_all(hyps, refs, preserve_case)
    return {"BLEU": _mteval_bleu(total), "NIST": _mteval_nist(total, len(segs))}


def _nist_sentavg(segs: list[_MtevalStats]) -> float:
    """Mean of mteval's segment-level NIST (each segment its own ``nsys``)."""
    return sum(_mteval_nist(s, 1) for s in segs) / len(segs)


def _nist_nltk_style(hyp_tok: list[list[str]], ref_tok: list[list[list[str]]], n_max: int = 5) -> float:
    """NLTK ``corpus_nist`` semantics: best single reference per sentence and order."""
    freq: Counter = Counter()
    total_words = 0
    for rs in ref_tok:
        for toks in rs:
            freq.update(_ngram_counter(toks, n_max))
            total_words += len(toks)
    weight = {}
    for gram, c in freq.items():
        prefix = gram[:-1]
        num = freq[prefix] if prefix and prefix in freq else total_words
        weight[gram] = math.log(num / c, 2)
    numer = [0.0] * (n_max + 1)
    denom = [0] * (n_max + 1)
    sys_len = 0
    ref_len = 0
    for n in range(1, n_max + 1):
        for hyp, rs in zip(hyp_tok, ref_tok):
            hyp_grams = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
            best = None
            for toks in rs:
                ref_grams = Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))
                overlap = hyp_grams & ref_grams
                num = sum(weight[g] * c for g, c in overlap.items())
                den = sum(hyp_grams.values())
                prec = 0 if den == 0 else num / den
                cand = (prec, num, den, len(toks))
                if best is None or cand > best:
                    best = cand
            numer[n] += best[1]
            denom[n] += best[2]
            ref_len += best[3]
            sys_len += len(hyp)
    score = sum(numer[n] / denom[n] for n in range(1, n_max + 1) if denom[n] > 0)
    ratio = sys_len / ref_len if ref_len else 0.0
    if 0 < ratio < 1:
        lp = _nist_length_penalty(ratio)
    else:
        lp = max(min(ratio, 1.0), 0.0)
    return score * lp


# --------------------------------------------------------------------------- #
# Java helpers: Stanford PTBTokenizer and METEOR 1.5
# --------------------------------------------------------------------------- #
_JAVA_ADVICE = (
    "Java (a JRE, version 17 or newer) is needed for METEOR 1.5 and for the Stanford "
    "PTB tokeniser that the E2E scorer runs before METEOR, ROUGE-L and CIDEr, but no "
    "`java` executable was found on PATH. Install one, e.g. `apt-get install "
    "openjdk-17-jre-headless` on Debian/Ubuntu (or `brew install openjdk@17`, or a "
    "Temurin 17 build), make sure `java -version` works, and run again."
)
_PTB_DROP = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-",
                       ".", "?", "!", ",", ":", "-", "--", "...", ";"])
# characters that would break the one-line-per-segment protocol of both jars
_LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# The JVM writes its own warnings (a thread it could not start on a loaded machine, a GC
# notice) to stdout by default, where the tokeniser's and METEOR's answers are read line by
# line: one such line desynchronises them. Sent to stderr, they stay in the error report.
_JVM_WARNINGS_TO_STDERR = ("-Xlog:disable", "-Xlog:all=warning:stderr")


def _java() -> str:
    exe = shutil.which("java")
    if exe is None:
        raise MetricError(_JAVA_ADVICE)
    return exe


def _pycoco_file(*parts: str) -> Path:
    spec = importlib.util.find_spec("pycocoevalcap")
    if spec is None or not spec.submodule_search_locations:
        raise MetricError("the pycocoevalcap package (which ships the METEOR and Stanford "
                          "tokeniser jars) is not installed: pip install pycocoevalcap")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)
    if not path.is_file():
        raise MetricError(f"expected jar not found: {path}")
    return path


def _ptb_raw(texts: Sequence[str], jar: str | os.PathLike | None = None) -> list[list[str]]:
    """Run the Stanford PTBTokenizer over texts; one lowercased token list per text."""
    java = _java()
    jar_path = Path(jar) if jar is not None else _pycoco_file("tokenizer", "stanford-corenlp-3.4.1.jar")
    if not jar_path.is_file():
        raise MetricError(f"Stanford tokeniser jar not found: {jar_path}")
    lines = [_LINE_BREAKS.sub(" ", t) for t in texts]
    with tempfile.TemporaryDirectory(prefix="darel-ptb-") as tmp:
        src = Path(tmp) / "input.txt"
        src.write_text("\n".join(lines), encoding="utf-8")
        proc = subprocess.run(
            [java, *_JVM_WARNINGS_TO_STDERR, "-Dfile.encoding=UTF-8", "-cp", str(jar_path),
             "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines", "-lowerCase", str(src)],
            capture_output=True,
        )
    if proc.returncode != 0:
        raise MetricError("Stanford PTBTokenizer failed (exit %d): %s"
                          % (proc.returncode, proc.stderr.decode("utf-8", "replace")[-2000:]))
    out = proc.stdout.decode("utf-8").split("\n")
    if len(out) < len(lines) or any(x.strip() for x in out[len(lines):]):
        surplus = [x for x in out[len(lines):] if x.strip()][:3]
        raise MetricError(f"PTBTokenizer returned {len(out)} lines for {len(lines)} inputs"
                          + (f"; its surplus lines begin {surplus!r}" if surplus else "")
                          + (f"; stderr: {proc.stderr.decode('utf-8', 'replace')[-500:]!r}" if proc.stderr else ""))
    return [line.rstrip().split(" ") if line.strip() else [] for line in out[:len(lines)]]


def _coco_filter(tokens: list[str]) -> str:
    return " ".join(t for t in tokens if t not in _PTB_DROP)


def ptb_tokenize(texts: Sequence[str], *, jar: str | os.PathLike | None = None,
                 drop_punct: bool = True) -> list[str]:
    """The E2E/MS-COCO pre-processing: PTB tokens, lowercased, punctuation tokens dropped.

    Returns one space-joined string per input text (``""`` for an empty one).
    """
    raw = _ptb_raw(list(texts), jar)
    if drop_punct:
        return [_coco_filter(t) for t in raw]
    return [" ".join(t) for t in raw]


class _MeteorProcess:
    """One long-lived ``meteor-1.5.jar -stdio`` process (loading it takes seconds)."""

    def __init__(self, java: str, jar: Path):
        self.pid = os.getpid()
        self.errlog = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [java, *_JVM_WARNINGS_TO_STDERR, "-Dfile.encoding=UTF-8", "-Xmx2G", "-jar", str(jar),
             "-", "-", "-stdio", "-l", "en", "-norm"],
            cwd=str(jar.parent), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.errlog,
        )
        self._pending = b""  # answer bytes read but not yet returned

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.proc.poll() is None

    def _exchange(self, lines: list[str], n_answers: int, progress=None) -> list[str]:
        """Send ``lines`` and read ``n_answers`` answer lines. A writer thread feeds stdin
        while this thread reads stdout in large chunks, so the jar never waits for us
        line by line (and neither pipe can fill up and block the other)."""
        payload = "".join(line + "\n" for line in lines).encode("utf-8")
        failure: list[BaseException] = []

        def write() -> None:
            try:
                self.proc.stdin.write(payload)
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as exc:
                failure.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        answers: list[str] = []
        fd = self.proc.stdout.fileno()
        while len(answers) < n_answers:
            if b"\n" not in self._pending:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    writer.join()
                    cause = f"; {failure[0]}" if failure else ""
                    raise MetricError(f"METEOR process stopped answering{cause}; {self._stderr()}")
                self._pending += chunk
                continue
            *complete, self._pending = self._pending.split(b"\n")
            got = [line.decode("utf-8").strip() for line in complete]
            answers.extend(got)
            if progress is not None:
                progress(len(got))
        writer.join()
        if failure:
            raise MetricError(f"METEOR process died: {failure[0]}; {self._stderr()}")
        if len(answers) > n_answers:
            raise MetricError(f"METEOR answered {len(answers)} lines, expected {n_answers}; {self._stderr()}")
        return answers

    def _stderr(self) -> str:
        try:
            self.errlog.seek(0)
            return "stderr: " + self.errlog.read().decode("utf-8", "replace")[-2000:]
        except OSError:
            return "stderr unavailable"

    def score(self, hyps: Sequence[str], refs: Sequence[Sequence[str]], progress=None) -> tuple[float, list[float]]:
        lines = []
        for h, rs in zip(hyps, refs):
            h = h.replace("|||", "").replace("  ", " ")
            rs = [r.replace("|||", "") for r in rs]
            lines.append(" ||| ".join(["SCORE", " ||| ".join(rs), h]))
        stats = self._exchange(lines, len(lines), progress)
        answers = self._exchange([" ||| ".join(["EVAL"] + stats)], len(stats) + 1)
        try:
            values = [float(a) for a in answers]
        except ValueError as exc:
            raise MetricError(f"unexpected METEOR output: {answers[:3]!r}; {self._stderr()}") from exc
        return values[-1], values[:-1]

    def close(self) -> None:
        if self.pid != os.getpid():
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.kill()
        self.proc.wait()
        self.errlog.close()


_METEOR_LOCK = threading.Lock()
_METEOR_PROCS: dict[tuple[str, str], _MeteorProcess] = {}


def close_java_helpers() -> None:
    """Stop the cached METEOR process(es) (also done automatically at exit)."""
    with _METEOR_LOCK:
        for proc in _METEOR_PROCS.values():
            proc.close()
        _METEOR_PROCS.clear()


atexit.register(close_java_helpers)


def _meteor_key(jar=None) -> tuple[str, Path]:
    java = _java()
    jar_path = Path(jar) if jar is not None else _pycoco_file("meteor", "meteor-1.5.jar")
    if not jar_path.is_file():
        raise MetricError(f"METEOR jar not found: {jar_path}")
    return java, jar_path


def _start_meteor(jar=None) -> None:
    """Start the METEOR process now (it loads its tables for seconds) if none runs."""
    java, jar_path = _meteor_key(jar)
    key = (java, str(jar_path.resolve()))
    with _METEOR_LOCK:
        proc = _METEOR_PROCS.get(key)
        if proc is None or not proc.alive():
            _METEOR_PROCS[key] = _MeteorProcess(java, jar_path)


def _meteor_scores(tok_hyps, tok_refs, jar=None, progress=None) -> tuple[float, list[float]]:
    java, jar_path = _meteor_key(jar)
    key = (java, str(jar_path.resolve()))
    with _METEOR_LOCK:
        proc = _METEOR_PROCS.get(key)
        if proc is None or not proc.alive():
            proc = _MeteorProcess(java, jar_path)
            _METEOR_PROCS[key] = proc
        try:
            return proc.score(tok_hyps, tok_refs, progress)
        except MetricError:
            proc.close()
            _METEOR_PROCS.pop(key, None)
            raise


def _prepare_coco(hyps, refs, tokenize, jar):
    """Return (hyp strings, ref string lists, raw PTB tokens or None) for the COCO metrics."""
    if not tokenize:
        clean = lambda s: _LINE_BREAKS.sub(" ", s)  # noqa: E731
        return [clean(h) for h in hyps], [[clean(r) for r in rs] for rs in refs], None
    flat = list(hyps) + [r for rs in refs for r in rs]
    raw = _ptb_raw(flat, jar)
    filtered = [_coco_filter(t) for t in raw]
    n = len(hyps)
    out_refs, pos = [], n
    for rs in refs:
        out_refs.append(filtered[pos:pos + len(rs)])
        pos += len(rs)
    raw_hyps = raw[:n]
    raw_refs, pos = [], n
    for rs in refs:
        raw_refs.append(raw[pos:pos + len(rs)])
        pos += len(rs)
    return filtered[:n], out_refs, (raw_hyps, raw_refs)


def meteor(hyps: Sequence[str], refs: Sequence[Sequence[str]], jar: str | os.PathLike | None = None,
           *, tokenize: bool = True, tokenizer_jar: str | os.PathLike | None = None) -> float:
    """Corpus METEOR 1.5 (0-1) as in the E2E scorer (PTB tokens, ``-l en -norm``).

    ``jar`` defaults to the ``meteor-1.5.jar`` inside pycocoevalcap.  With
    ``tokenize=False`` the inputs are taken as already tokenised.
    """
    _check_inputs(hyps, refs)
    h, r, _ = _prepare_coco(hyps, refs, tokenize, tokenizer_jar)
    return _meteor_scores(h, r, jar)[0]


# --------------------------------------------------------------------------- #
# ROUGE-L and CIDEr-D (MS-COCO caption code definitions)
# --------------------------------------------------------------------------- #
_ROUGE_BETA = 1.2


def _lcs_length(a: list[str], b: list[str]) -> int:
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            if x == y:
                cur.append(prev[j - 1] + 1)
            else:
                cur.append(cur[j - 1] if cur[j - 1] > prev[j] else prev[j])
        prev = cur
    return prev[-1]


def _rouge_l_sentence(hyp: str, refs: Sequence[str]) -> float:
    cand = hyp.split(" ")
    best_p = best_r = 0.0
    for ref in refs:
        toks = ref.split(" ")
        lcs = _lcs_length(toks, cand)
        best_p = max(best_p, lcs / len(cand))
        best_r = max(best_r, lcs / len(toks))
    if best_p == 0 or best_r == 0:
        return 0.0
    b2 = _ROUGE_BETA ** 2
    return (1 + b2) * best_p * best_r / (best_r + b2 * best_p)


def _rouge_l_tok(hyps, refs) -> float:
    return sum(_rouge_l_sentence(h, rs) for h, rs in zip(hyps, refs)) / len(hyps)


def rouge_l(hyps: Sequence[str], refs: Sequence[Sequence[str]], *, tokenize: bool = True,
            tokenizer_jar: str | os.PathLike | None = None) -> float:
    """ROUGE-L (0-1) as pycocoevalcap's ``Rouge`` after the E2E PTB tokenisation.

    ``tokenize=False`` scores the strings as given (split on single spaces).
    """
    _check_inputs(hyps, refs)
    h, r, _ = _prepare_coco(hyps, refs, tokenize, tokenizer_jar)
    return _rouge_l_tok(h, r)


_CIDER_N = 4
_CIDER_SIGMA = 6.0


def _cider_counts(sentence: str) -> Counter:
    return _ngram_counter(sentence.split(), _CIDER_N)


def _cider_tok(hyps, refs) -> float:
    hyp_counts = [_cider_counts(h) for h in hyps]
    ref_counts = [[_cider_counts(r) for r in rs] for rs in refs]
    doc_freq: Counter = Counter()
    for rcs in ref_counts:
        seen = set()
        for rc in rcs:
            seen.update(rc)
        doc_freq.update(seen)
    log_n = math.log(float(len(ref_counts)))

    def vectorise(counts: Counter):
        vec = [dict() for _ in range(_CIDER_N)]
        sq = [0.0] * _CIDER_N
        bigrams = 0
        for gram, tf in counts.items():
            k = len(gram) - 1
            w = tf * (log_n - math.log(max(1.0, doc_freq.get(gram, 0.0))))
            vec[k][gram] = w
            sq[k] += w * w
            if k == 1:  # pycocoevalcap's "length" counts bigrams
                bigrams += tf
        return vec, [math.sqrt(s) for s in sq], bigrams

    total = 0.0
    for hc, rcs in zip(hyp_counts, ref_counts):
        hv, hn, hl = vectorise(hc)
        acc = [0.0] * _CIDER_N
        for rc in rcs:
            rv, rn, rl = vectorise(rc)
            penalty = math.exp(-((hl - rl) ** 2) / (2 * _CIDER_SIGMA ** 2))
            for k in range(_CIDER_N):
                dot = 0.0
                rk = rv[k]
                for gram, w in hv[k].items():
                    r_w = rk.get(gram, 0.0)
                    dot += min(w, r_w) * r_w
                if hn[k] != 0 and rn[k] != 0:
                    dot /= hn[k] * rn[k]
                acc[k] += dot * penalty
        total += 10.0 * (sum(acc) / _CIDER_N) / len(rcs)
    return total / len(hyps)


def cider(hyps: Sequence[str], refs: Sequence[Sequence[str]], *, tokenize: bool = True,
          tokenizer_jar: str | os.PathLike | None = None) -> float:
    """CIDEr-D as pycocoevalcap's ``Cider`` (n=4, sigma=6, x10) after PTB tokenisation.

    Document frequencies come from the references of the evaluated set, so
    the value depends on the whole corpus (a one-instance corpus scores 0).
    """
    _check_inputs(hyps, refs)
    h, r, _ = _prepare_coco(hyps, refs, tokenize, tokenizer_jar)
    return _cider_tok(h, r)


# --------------------------------------------------------------------------- #
# TER (sacrebleu)
# --------------------------------------------------------------------------- #
def ter(hyps: Sequence[str], refs: Sequence[Sequence[str]], *, workers: int = 1, progress=None) -> float:
    """sacrebleu TER with default options, multi-reference, in **percent** (0-100+).

    Computed by :mod:`darel.nlg.ter` (the same values as sacrebleu's ``TER()``, faster);
    ``workers`` > 1 spreads the segments over processes, ``progress(n)`` reports them."""
    _check_inputs(hyps, refs)
    return corpus_ter(list(hyps), [list(rs) for rs in refs], workers=workers, progress=progress)


# --------------------------------------------------------------------------- #
# paper-scale METEOR variant (NLTK formula, exact matching only)
# --------------------------------------------------------------------------- #
def _nltk_meteor_exact_sentence(hyp: list[str], ref: list[str], alpha=0.9, beta=3.0, gamma=0.5) -> float:
    hyp = [w.lower() for w in hyp]
    ref = [w.lower() for w in ref]
    if not hyp or not ref:
        return 0.0
    # NLTK's greedy exact stage: walk the hypothesis from its end, take the last
    # still-unmatched equal reference word.
    free = list(enumerate(ref))
    pairs = []
    for hi in range(len(hyp) - 1, -1, -1):
        for k in range(len(free) - 1, -1, -1):
            if free[k][1] == hyp[hi]:
                pairs.append((hi, free[k][0]))
                del free[k]
                break
    m = len(pairs)
    if m == 0:
        return 0.0
    pairs.sort()
    chunks = 1
    for (h0, r0), (h1, r1) in zip(pairs, pairs[1:]):
        if not (h1 == h0 + 1 and r1 == r0 + 1):
            chunks += 1
    p, r = m / len(hyp), m / len(ref)
    fmean = p * r / (alpha * p + (1 - alpha) * r)
    return (1 - gamma * (chunks / m) ** beta) * fmean


# --------------------------------------------------------------------------- #
# everything at once
# --------------------------------------------------------------------------- #
def score_all(hyps: Sequence[str], refs: Sequence[Sequence[str]], *, variants: bool = False,
              meteor_jar: str | os.PathLike | None = None,
              tokenizer_jar: str | os.PathLike | None = None, progress: bool | None = False,
              workers: int = 1) -> dict:
    """The official E2E suite plus TER: keys BLEU, NIST, METEOR, ROUGE_L, CIDEr, TER.

    Scales: BLEU, METEOR, ROUGE_L 0-1; NIST raw; CIDEr raw (x10 built in);
    TER percent.  ``variants=True`` adds the paper-scale keys of
    ``VARIANT_KEYS`` (see the module docstring for what each one is).

    The Java side (PTB tokenisation, then METEOR) runs in a helper thread while this
    one computes BLEU, NIST and TER, so the two CPUs' work overlaps. ``progress``: a
    tqdm bar on stderr over the segments METEOR and TER have done (None: only when
    stderr is a terminal). ``workers``: processes for TER.
    """
    _check_inputs(hyps, refs)
    from tqdm import tqdm

    bar = tqdm(total=2 * len(hyps), desc="NLG metrics (METEOR + TER segments)", unit="seg",
               disable=None if progress is None else not progress, leave=False)
    lock = threading.Lock()

    def advance(count: int) -> None:
        with lock:
            bar.update(count)

    java: dict = {}

    def run_java() -> None:
        try:
            _start_meteor(meteor_jar)  # its start-up overlaps the PTB tokenisation below
            java["coco"] = _prepare_coco(hyps, refs, True, tokenizer_jar)
            coco_h, coco_r, _ = java["coco"]
            java["meteor"] = _meteor_scores(coco_h, coco_r, meteor_jar, advance)
        except BaseException as exc:  # re-raised in the caller's thread
            java["error"] = exc

    helper = threading.Thread(target=run_java, name="darel-nlg-java", daemon=True)
    helper.start()
    try:
        total, segs, _, _ = _mteval_all(hyps, refs)
        out = {"BLEU": _mteval_bleu(total), "NIST": _mteval_nist(total, len(segs))}
        ter_value = ter(hyps, refs, workers=workers, progress=advance)
    finally:
        helper.join()
        bar.close()
    if "error" in java:
        raise java["error"]
    coco_h, coco_r, raw = java["coco"]
    met, met_segs = java["meteor"]
    out["METEOR"] = met
    out["ROUGE_L"] = _rouge_l_tok(coco_h, coco_r)
    out["CIDEr"] = _cider_tok(coco_h, coco_r)
    out["TER"] = ter_value
    if variants:
        raw_h, raw_r = raw
        per_sent = [max(_nltk_meteor_exact_sentence(h, r) for r in rs) for h, rs in zip(raw_h, raw_r)]
        out["METEOR_nltk_exact_x100"] = 100.0 * sum(per_sent) / len(per_sent)
        out["METEOR_sentavg_x100"] = 100.0 * sum(met_segs) / len(met_segs)
        cased_h = [mteval_tokenize(h, preserve_case=True) for h in hyps]
        cased_r = [[mteval_tokenize(r, preserve_case=True) for r in rs] for rs in refs]
        out["NIST_nltk"] = _nist_nltk_style(cased_h, cased_r)
        out["NIST_sentavg"] = _nist_sentavg(segs)
    return out
