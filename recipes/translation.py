"""Translation recipe: SCST / REINFORCE / scheduled sampling on a seq2seq model, scored by corpus BLEU and chrF.

    accelerate launch --config_file recipes/accelerate_configs/multi_gpu.yaml recipes/translation.py \
        --config recipes/configs/marian_opus_mt_de_en_wmt16.yaml [--any_setting value ...]

Every field of `hf_seqrl.pipeline.ScriptArguments` and of the algorithm's config (`SeqRLConfig` or
`ScheduledSamplingConfig`, i.e. all `Seq2SeqTrainingArguments`) can be set in the YAML file or on the command
line; the command line wins. Also runs as `python recipes/translation.py --config ...` (one process).
"""

from __future__ import annotations

import sys

from hf_seqrl.pipeline import parse_args, run


def main(argv: list[str] | None = None) -> dict[str, float]:
    script_args, training_args = parse_args(argv, defaults={"task": "translation"})
    if script_args.task != "translation":
        raise SystemExit(f"task={script_args.task!r}: this recipe translates; use recipes/summarization.py.")
    # parse → data → trainer → train → evaluate on the test split → save (model, tokenizer, card) → push
    return run(script_args, training_args)


if __name__ == "__main__":
    main(sys.argv[1:])
