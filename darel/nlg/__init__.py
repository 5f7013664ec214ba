"""Natural-language-generation half of the reproduction (paper Tables 2 and 3).

* ``schemas``: E2E-NLG and WebNLG 2017 records, MR/triple syntax, on-disk formats;
* ``readers``: the official files' readers and downloads (and local copies in data/raw);
* ``synthetic``: stand-ins built from the real schemas for offline tests and quick runs;
* ``tokenizer``: a small byte-level BPE tokenizer trained locally (quick profile);
* ``lm``: GPT-2 + LoRA fine-tuning with the paper's protocol, beam-search decoding,
  and the per-sample language-model loss used as Algorithm 2's offline score;
* ``metrics``: the E2E NLG Challenge metric suite plus TER (``ter``: a fast exact
  sacrebleu TER), ``metrics_cli`` the ``darel-nlg-metrics`` command;
* ``tables``: Tables 2 and 3 from the cell records, and their comparison with the paper.
"""
