"""Usage: python benchmarks/quality_length_fix.py xe|scst (after the final translation run has cached C).

Does a length fix at decoding recover RL's greedy gain? Retrains one arm (seed 0, deterministic: the same model
as the recorded run), then decodes greedily with the EOS logit lowered by delta (transformers' sequence_bias),
delta chosen on dev by BLEU, and reports test BLEU / brevity penalty at each delta."""
import json
import os
import shutil
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import quality
from hf_seqrl.evaluation import evaluate_model
from hf_seqrl.rewards import bleu_brevity
import torch

arm = sys.argv[1]
torch.set_num_threads(1)
settings, overrides = quality.apply_overrides(quality.SETTINGS[("translation", False)],
    ["arm_lr=5e-5", "rl_lr=5e-5", "center_advantages=true", "budget_positions=3000000"])
work = os.path.join(HERE, "cache", "length_fix", arm)
os.makedirs(work, exist_ok=True)
for sub in ("C", "C_annealed", "tokenizer"):
    if not os.path.exists(f"{work}/{sub}"):
        shutil.copytree(os.path.join(HERE, "cache", "quality_translation", sub), f"{work}/{sub}")
splits = quality.load_task(settings, quality.DEFAULT_DATA)
tok = quality.build_tokenizer(settings, splits["train"], f"{work}/tokenizer")
ds = quality.to_dataset(splits["train"], tok, settings)
from transformers import set_seed
set_seed(0)
model = quality.load_model(settings, f"{work}/C_annealed")
trainer = quality.arm_trainer(arm, model, tok, ds, settings, f"{work}/tmp", 0, statistics.mean(len(x) for x in ds["labels"]))
counter = quality.DecoderPositions(model)
trainer.add_callback(quality.position_budget(counter, settings.budget_positions))
eos = model.config.eos_token_id
model.generation_config.sequence_bias = {(eos,): -1.0}  # fail fast if decoding with a bias breaks
print("check", evaluate_model(model, tok, [r["source"] for r in splits["dev"][:8]], [r["references"] for r in splits["dev"][:8]], ("bleu",), batch_size=8, max_new_tokens=20)[1][:2], flush=True)
model.generation_config.sequence_bias = None
trainer.train(); counter.remove()
model.save_pretrained(f"{work}/trained")
out = {}
for split in ("dev", "test"):
    rows = splits[split]
    for delta in (0.0, 0.5, 1.0, 1.5, 2.0):
        kw = dict(num_beams=1, batch_size=64, max_new_tokens=settings.max_new_tokens,
                  max_source_length=settings.max_source_tokens)
        model.generation_config.sequence_bias = {(eos,): -delta} if delta else None
        scores, preds = evaluate_model(model, tok, [r["source"] for r in rows], [r["references"] for r in rows],
                                       ("bleu",), **kw)
        bp = bleu_brevity(preds, [r["references"] for r in rows])
        out[f"{split}_{delta}"] = {"bleu": round(scores["bleu"], 2), "bp": round(bp["bp"], 4), "ratio": round(bp["ratio"], 4)}
        print(arm, split, delta, out[f"{split}_{delta}"], flush=True)
json.dump(out, open(os.path.join(HERE, "results", f"quality_translation_length_fix_{arm}.json"), "w"), indent=1)
