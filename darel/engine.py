"""The image training loop's former module name: it is ``darel.image_training`` now (the
loop trains images only; LoRA fine-tuning is darel.nlg.lm.finetuning, both on the epoch
skeleton of darel.epochs). Kept for one release: importing it gives that module."""

import sys

from darel import image_training

sys.modules[__name__] = image_training
