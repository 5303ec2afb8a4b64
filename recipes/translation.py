"""Translation recipe: any hf-seqrl trainer (`--algorithm`) on a seq2seq or decoder-only model, scored by corpus BLEU and chrF.

    accelerate launch --config_file recipes/accelerate_configs/multi_gpu.yaml recipes/translation.py \
        --config recipes/configs/marian_opus_mt_de_en_wmt16.yaml [--any_setting value ...]

Every field of `hf_seqrl.cli.train.ScriptArguments` and of the algorithm's config (`SeqRLConfig`, `MRTConfig`,
`ScheduledSamplingConfig`, ...: all `Seq2SeqTrainingArguments` included) can be set in the YAML file or on the command
line; the command line wins. Also runs as `python recipes/translation.py --config ...` (one process).
"""

from __future__ import annotations

import sys

from hf_seqrl.cli.train import train_main


def main(argv: list[str] | None = None) -> dict[str, float]:
    return train_main(argv, task="translation")


if __name__ == "__main__":
    main(sys.argv[1:])
