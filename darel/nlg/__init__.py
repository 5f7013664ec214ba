"""Natural-language-generation half of the reproduction (paper Tables 2 and 3).

* ``datasets``: E2E-NLG and WebNLG 2017 records, their official-file readers, and
  synthetic stand-ins built from the real schemas for offline tests and quick runs;
* ``tokenizer``: a small byte-level BPE tokenizer trained locally (quick profile);
* ``lm``: GPT-2 + LoRA fine-tuning with the paper's protocol, beam-search decoding,
  and the per-sample language-model loss used as Algorithm 2's offline score.
"""
