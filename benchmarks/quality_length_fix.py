"""Usage: python benchmarks/quality_length_fix.py xe|scst (after the run of quality_translation.json cached C).

Does a length fix at decoding recover RL's greedy gain? Retrains one arm of that run (seed 0,
deterministic: the same model as the recorded run) from the cached C, then decodes dev and test greedily with
the EOS logit lowered by each delta (transformers' `sequence_bias`) and writes BLEU, brevity penalty and length
ratio per delta to benchmarks/results/quality_translation_length_fix_<arm>.json."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import quality_lib as quality  # noqa: E402

DELTAS = (0.0, 0.5, 1.0, 1.5, 2.0)
# The overrides of the recorded run (benchmarks/results/quality_translation.json).
RECORDED_RUN = ["arm_lr=5e-5", "rl_lr=5e-5", "center_advantages=true", "budget_positions=3000000"]


def main(arm: str) -> dict:
    """Retrains `arm` as in the recorded run, writes and returns its dev and test scores per EOS bias."""
    import torch

    from hf_seqrl.evaluation import bleu_brevity, evaluate_model

    torch.set_num_threads(1)
    settings, _ = quality.apply_overrides(quality.SETTINGS[("translation", False)], RECORDED_RUN)
    cache = quality.default_work_dir("translation")
    splits, tokenizer, dataset = quality.task_data(settings, quality.DEFAULT_DATA, cache)
    model, _ = quality.train_arm(arm, 0, settings, tokenizer, dataset, os.path.join(HERE, "cache", "length_fix", arm),
                                 os.path.join(cache, "C_annealed"))
    eos = model.config.eos_token_id
    out = {}
    for split in ("dev", "test"):
        rows = splits[split]
        references = [r["references"] for r in rows]
        for delta in DELTAS:
            model.generation_config.sequence_bias = {(eos,): -delta} if delta else None
            scores, predictions = evaluate_model(model, tokenizer, [r["source"] for r in rows], references,
                                                 ("bleu",), num_beams=1, batch_size=settings.eval_batch,
                                                 max_new_tokens=settings.max_new_tokens,
                                                 max_source_length=settings.max_source_tokens)
            brevity = bleu_brevity(predictions, references)
            out[f"{split}_{delta}"] = {"bleu": round(scores["bleu"], 2), "bp": round(brevity["bp"], 4),
                                       "ratio": round(brevity["ratio"], 4)}
            print(arm, split, delta, out[f"{split}_{delta}"], flush=True)
    with open(os.path.join(HERE, "results", f"quality_translation_length_fix_{arm}.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main(sys.argv[1])
