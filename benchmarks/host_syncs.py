"""Host syncs per decoded position through the trainers: SCST, leave-one-out x4 and MRT on a tiny T5 and a tiny Llama,
every row running to the limit (EOS never chosen), a banned token set; the count at two limits, and the difference per
further position, split by the library whose code made the host wait (`counting.SyncCounter`).

    python benchmarks/host_syncs.py [--device cpu] [--output benchmarks/results/host_syncs.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from counting import SyncCounter  # noqa: E402

EOS = 1
SOURCES = ["abc def", "hello there", "world peace", "seq level"]
ARMS = ("scst", "loo4", "mrt")


def count(family: str, arm: str, max_new_tokens: int, device: str, steps: int) -> SyncCounter:
    """Returns the counter after `steps` training steps of `arm` on a tiny model of `family`."""
    from datasets import Dataset
    from transformers import ByT5Tokenizer

    from hf_seqrl import MRTConfig, MRTTrainer, SCSTTrainer, SeqRLConfig
    from hf_seqrl.models.tiny import build_tiny_model

    model = build_tiny_model("t5" if family == "seq2seq" else "llama", vocab_size=384, d_model=32,
                             layers=1 if family == "seq2seq" else 2, dropout=0.1 if family == "seq2seq" else 0.0,
                             max_positions=128, pad_token_id=0, eos_token_id=EOS, seed=0)
    model.generation_config.bad_words_ids = [[5]]  # a ban, as opus-mt models ban pad
    model.get_output_embeddings().register_forward_hook(lambda module, inputs, out: out.index_add(
        -1, torch.tensor([EOS], device=out.device), torch.full((*out.shape[:-1], 1), -1e4, dtype=out.dtype,
                                                               device=out.device)))
    columns = ("source", "target") if family == "seq2seq" else ("prompt", "completion")
    data = Dataset.from_dict({columns[0]: SOURCES, columns[1]: [s[::-1] for s in SOURCES]})
    trainer_class, config_class, settings = {
        "scst": (SCSTTrainer, SeqRLConfig, {}), "loo4": (SCSTTrainer, SeqRLConfig, dict(baseline="mean", num_samples=4)),
        "mrt": (MRTTrainer, MRTConfig, dict(num_samples=3))}[arm]
    args = config_class(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=steps,
                        report_to="none", max_new_tokens=max_new_tokens, save_strategy="no", disable_tqdm=True,
                        logging_steps=1000, use_cpu=device == "cpu", seed=0, **settings)
    trainer = trainer_class(model=model, args=args, reward_funcs="chrf", processing_class=ByT5Tokenizer(),
                            train_dataset=data)
    counter, training_step = SyncCounter(), trainer.training_step

    def counted(*a, **k):
        with counter.counting():
            return training_step(*a, **k)

    trainer.training_step = counted
    with counter:
        trainer.train()
    return counter


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--limits", type=int, nargs=2, default=(8, 24))
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.set_num_threads(1)
    short, long = args.limits
    rows = []
    for family in ("seq2seq", "causal"):
        for arm in ARMS:
            a, b = (count(family, arm, limit, args.device, args.steps) for limit in (short, long))
            positions = (long - short) * args.steps
            rows.append({"family": family, "arm": arm, **{
                f"{site}_per_position": (b.by_site[site] - a.by_site[site]) / positions
                for site in ("hf_seqrl", "transformers", "other")}, "per_step_at_short_limit": a.total / args.steps})
    print(f"{'family':<9}{'arm':<6}{'hf-seqrl':>10}{'transformers':>14}{'other':>8}{'per step':>10}")
    for row in rows:
        print(f"{row['family']:<9}{row['arm']:<6}{row['hf_seqrl_per_position']:>10.2f}"
              f"{row['transformers_per_position']:>14.2f}{row['other_per_position']:>8.2f}"
              f"{row['per_step_at_short_limit']:>10.1f}")
    result = {"command": "python benchmarks/host_syncs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "device": args.device, "limits": [short, long], "steps": args.steps, "torch": torch.__version__,
              "results": rows}
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
