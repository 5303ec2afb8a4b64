"""Times the RL step's scoring pass on CPU with the log-probs and entropy computed block by block (the default)
against the same math over the whole logits tensor at once (what other devices run).

The pass is what `SeqRLTrainer` runs after a rollout: one teacher-forced forward over the samples and the gold
rows, the sampled tokens' log-probs, the policy-gradient loss mixed with the gold cross-entropy
(`rl_weight=0.7`), the entropy metric, and the backward. Random-weight models at speed.py's shapes, translation
inputs (batch 8, 32 source / 32 target tokens). Each arm runs in its own process; the arms alternate for
`--rounds` rounds, each round timing `--steps` passes after one untimed pass.

    python benchmarks/scoring_pass.py            # prints a table, writes results/scoring_pass.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ARMS = ("blockwise", "whole_tensor")
CASES = (("t5-small", 1), ("t5-small", 4), ("marian-base", 1), ("marian-base", 4))  # (shape, samples per source)


def time_passes(shape: str, samples: int, arm: str, steps: int) -> list[float]:
    """Returns the seconds of `steps` scoring passes (after one untimed pass) in this process."""
    sys.path.insert(0, HERE)
    import speed

    from hf_seqrl import losses
    from hf_seqrl.functional import logprobs
    from hf_seqrl.models.base import decoder_start_id, pad_id
    from hf_seqrl.models.seq2seq import score_rollout

    if arm == "whole_tensor":
        logprobs.BLOCKWISE_DEVICES = ()
    torch.set_num_threads(1)
    model, _ = speed.build(shape, "cpu")
    vocab = speed.SHAPES[shape]["vocab"]
    src, attn, labels, _ = speed.batch_for("translation", 8, vocab, "cpu")
    gen = torch.Generator().manual_seed(2)
    sample_ids = torch.randint(3, vocab, (8 * samples, 32), generator=gen)
    mask = torch.ones_like(sample_ids, dtype=torch.bool)
    advantages = torch.randn(8 * samples, generator=gen)
    times = []
    for step in range(steps + 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        scored = score_rollout(model, src, attn, sample_ids, samples, decoder_start_id(model), pad_id(model),
                               gold_labels=labels)
        pg = losses.policy_gradient_loss(scored.token_logprobs, mask, advantages)
        if arm == "whole_tensor":  # the gold cross-entropy from its logits, a pass of its own
            xe = losses.cross_entropy_from_logprobs(scored.gold_logprobs, labels)
        else:
            xe = losses.cross_entropy_from_logprobs(scored.gold_logprobs, labels)
        with torch.no_grad():
            losses.token_entropy(scored.sample_logits)
        losses.mix_losses(pg, xe, 0.7).backward()
        if step:
            times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(HERE, "results", "scoring_pass.json"))
    parser.add_argument("--_arm", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._arm:
        shape, samples, arm, steps = args._arm
        print(json.dumps(time_passes(shape, int(samples), arm, int(steps))))
        return
    rows = []
    for shape, samples in CASES:
        seconds = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm in ARMS:
                out = subprocess.run([sys.executable, __file__, "--_arm", shape, str(samples), arm, str(args.steps)],
                                     capture_output=True, text=True, check=True).stdout
                seconds[arm] += json.loads(out.strip().splitlines()[-1])
        row = {"shape": shape, "samples": samples, **{f"{arm}_s": statistics.median(seconds[arm]) for arm in ARMS},
               "steps_s": seconds}
        row["ratio"] = row["blockwise_s"] / row["whole_tensor_s"]
        rows.append(row)
        print(f"{shape:12s} samples {samples}  blockwise {row['blockwise_s']:.3f} s  whole tensor "
              f"{row['whole_tensor_s']:.3f} s  ratio {row['ratio']:.2f}", flush=True)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump({"torch": torch.__version__, "threads": 1, "rounds": args.rounds, "steps": args.steps,
                   "rows": rows}, f, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
