"""Neural-metric rewards on SciTLDR: which reward moves which metric, what guards it, and what a reward costs per step.

From the quality benchmark's BERT2BERT checkpoint C (`quality.py --task summarization`, cached and shared), SCST
with four rewards at the quality protocol's budget of decoder positions: sentence ROUGE-L, MiniLM embedding
similarity to the references, BERTScore F1 on MiniLM (layer `quality_lib.BERTSCORE_LAYER`), and the mean of ROUGE-L and
the embedding similarity. `--rewards` names other rows of `ROWS` too: the embedding reward with the `length_ratio`
guard, the embedding reward gated by the guards `source_copy`, `repetition` and `length_ratio`
(`scst:embedding:guarded`), and leave-one-out over 4 samples with ROUGE-L + embedding summed before or normalized
before the sum (`multi_objective_aggregation`). C and every arm are scored on dev and test (greedy, and any other width of
`--set beams=`) with ROUGE-1/2/L, both neural metrics, the length ratio and `source_copy` (the share of output word
3-grams found in the source: an arm that games a metric by copying shows there). The arms are cached units of the
quality benchmark, so processes can split the rows, and a run adds its rows to the output file's rows measured from
the same C.

`--task translation` runs the rows on Multi30k de->en from the quality benchmark's translation C: the guards against
a reward that a copied source wins (MiniLM similarity to the German source), SCST unguarded and gated by the MT
guards, scored with BLEU, chrF, the length ratio, the copy share, the share in the target language and the
repetition rate.

`--timing` measures instead one SCST step from C per reward and batch size, each in a fresh process: the step time
and the time inside the reward (decoding the samples and scoring them), median over the timed steps. `--timed comet`
times COMET at its real size (`random_comet`), which the default `--timing` leaves out.

    python benchmarks/neural_rewards.py --quick                      # smoke run on a slice (also a test)
    python benchmarks/neural_rewards.py --seeds 0 1 --set center_advantages=true rl_temperature=0.7 beams=1
    python benchmarks/neural_rewards.py --seeds 0 1 --set center_advantages=true rl_temperature=0.7 beams=1 \
        --rewards embedding embedding+length_ratio loo4:rougeL+embedding loo4:rougeL+embedding:normalize_then_sum \
        --output benchmarks/results/neural_rewards_guards.json
    python benchmarks/neural_rewards.py --seeds 0 1 2 --set center_advantages=true rl_temperature=0.7 beams=1 \
        extra_metrics=embedding,bertscore,source_copy,repetition --rewards embedding scst:embedding:guarded \
        --output benchmarks/results/summarization_guards.json
    python benchmarks/neural_rewards.py --task translation --seeds 0 1 2 --set arm_lr=5e-5 rl_lr=5e-4 \
        center_advantages=true --rewards source_embedding scst:source_embedding:guarded \
        --output benchmarks/results/mt_guards.json
    python benchmarks/neural_rewards.py --timing --batch-sizes 8 32
    python benchmarks/neural_rewards.py --timing --timed comet --output benchmarks/results/neural_rewards_timing_comet.json

Writes benchmarks/results/neural_rewards.json (or --output) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import quality_lib as quality  # noqa: E402
from quality_lib.task import minilm_path  # noqa: E402

# The rows: name -> (arm, settings). A reward's name is its reward; the guarded and normalized rows set more. Several
# rewards are averaged (`--set reward=a+b`); `normalize_then_sum` needs a group of samples per source, so that row
# is leave-one-out over 4 samples, beside the same arm summing the rewards first.
ROWS = {
    "rougeL": ("scst", ["reward=rougeL"]), "embedding": ("scst", ["reward=embedding"]),
    "bertscore": ("scst", ["reward=bertscore"]), "rougeL+embedding": ("scst", ["reward=rougeL+embedding"]),
    "embedding+length_ratio": ("scst", ["reward=embedding+length_ratio"]),
    "loo4:rougeL+embedding": ("loo4", ["reward=rougeL+embedding"]),
    "loo4:rougeL+embedding:normalize_then_sum": ("loo4", ["reward=rougeL+embedding",
                                                          "multi_objective_aggregation=normalize_then_sum"]),
    "loo4:embedding+length_ratio:normalize_then_sum": ("loo4", ["reward=embedding+length_ratio",
                                                                "multi_objective_aggregation=normalize_then_sum"]),
    "loo4:rougeL+embedding+length_ratio:normalize_then_sum": (
        "loo4", ["reward=rougeL+embedding+length_ratio", "multi_objective_aggregation=normalize_then_sum"]),
    # The MT guards (`rewards.guard`) where a reward can be gamed: on SciTLDR the embedding reward (more words of the
    # topic, copying the abstract's words, repeating them), on Multi30k (`--task translation`) MiniLM similarity to the
    # source, which a copied (German) source wins, as a referenceless quality-estimation metric can be won.
    "scst:embedding:guarded": ("scst", ["reward=embedding", "guards=source_copy,repetition,length_ratio"]),
    "source_embedding": ("scst", ["reward=source_embedding"]),
    "scst:source_embedding:guarded": ("scst", ["reward=source_embedding",
                                               "guards=source_copy,target_language,repetition,length_ratio"]),
    # The gate without `length_ratio`: with the source similarity, samples run to the token limit (more words cover
    # more of the source), which the other three guards do not measure.
    "scst:source_embedding:guarded_without_length": ("scst", ["reward=source_embedding",
                                                              "guards=source_copy,target_language,repetition"]),
}
REWARDS = ("rougeL", "embedding", "bertscore", "rougeL+embedding")  # the default rows
ROW_TITLES = {"scst": "SCST", "loo4": "leave-one-out ×4"}
# --timing also times a reward model: MiniLM with a fresh one-output head scoring prediction-reference pairs (its values
# mean nothing; its cost is a reward model's of that size). It is not trained with.
TIMED = (*REWARDS, "reward_model")
# `--timed comet`: COMET at Unbabel/wmt22-comet-da's size, random weights built in memory (no checkpoint is read), its
# values meaningless and its cost COMET's: wmt22-comet-da's hyper-parameters (hparams.yaml: a regression_metric, layer
# mix by sparsemax without per-layer normalisation, average pooling, a 3072-1024 Tanh feed-forward) on an XLM-R large
# encoder (xlm-roberta-large's config). No XLM-R sentencepiece vocabulary is at hand offline: MiniLM's WordPiece
# tokenizer stands in (ids inside XLM-R's vocabulary, subword lengths near XLM-R's on English text).
COMET_HPARAMS = dict(class_identifier="regression_metric", encoder_model="XLM-RoBERTa",
                     pretrained_model="xlm-roberta-large", layer="mix", layer_transformation="sparsemax",
                     layer_norm=False, pool="avg", hidden_sizes=[3072, 1024], activations="Tanh", final_activation=None)
XLMR_LARGE = dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)
# What every split is scored with beside the task's metrics (`--set extra_metrics=...` adds to it), and the table's
# columns, per task: the guards' behaviours as rates (`source_copy`: % of output 3-grams found in the source;
# `target_language`: % of the output in the target language; `repetition`: % of repeated 3-grams).
EXTRA = {"summarization": "extra_metrics=embedding,bertscore,source_copy",
         "translation": "extra_metrics=source_copy,target_language,repetition"}
COLUMNS = {"summarization": ("rougeL", "rouge1", "rouge2", "embedding", "bertscore", "length_ratio", "source_copy",
                             "target_language", "repetition"),
           "translation": ("bleu", "chrf", "length_ratio", "source_copy", "target_language", "repetition")}


def quality_args(args, row: str, output: str) -> list[str]:
    """Returns the `quality.py` arguments of the row `row` of `ROWS`."""
    arm, settings = ROWS[row]
    argv = ["--task", args.task, "--arms", arm, "--set", *settings, EXTRA[args.task], *args.set,
            "--output", output, "--jobs", str(args.jobs), "--work-dir", work_dir(args)]
    argv += ["--quick"] if args.quick else []
    argv += ["--seeds", *map(str, args.seeds)] if args.seeds else []
    argv += ["--data-dir", args.data_dir] if args.data_dir else []
    return argv


def work_dir(args) -> str:
    """Returns the quality benchmark's work folder (C, its tokenizer, the cached arm units) that the runs share."""
    return args.work_dir or quality.default_work_dir(args.task, args.quick)


def row_title(row: str) -> str:
    """Returns the table's name of a row of `ROWS`: "SCST, reward embedding", "leave-one-out ×4, reward rougeL+embedding,
    normalize_then_sum"."""
    arm, _ = ROWS[row]
    reward, *how = row.split(":")[1:] if ":" in row else [row]
    return ", ".join([ROW_TITLES[arm], f"reward {reward}", *how])


def compare(args) -> dict:
    """Runs the arms of every row in `args.rewards` and returns the merged results."""
    work = os.path.join(work_dir(args), "neural_rewards")
    os.makedirs(work, exist_ok=True)
    merged, c_eval = {}, None
    for row in args.rewards:
        arm, _ = ROWS[row]
        result = quality.main(quality_args(args, row, os.path.join(work, f"{row.replace(':', '_')}.json")))
        c_eval = result["C"]
        merged[row_title(row)] = result["arms"][arm]
    return {"C": c_eval, "arms": merged}


def keep_other_rows(results: dict, output: str) -> dict:
    """Returns `results` with the rows of the earlier results in `output` that this run did not produce, when both
    start from the same C (its scores equal); else `results` alone."""
    if not os.path.exists(output):
        return results
    with open(output, encoding="utf-8") as f:
        earlier = json.load(f)
    same_c = {k: earlier["C"].get(k) for k in ("dev", "greedy")} == {k: results["C"].get(k) for k in ("dev", "greedy")}
    if not same_c:
        print(f"{output} was measured from another C: its rows are not kept.", flush=True)
        return results
    arms = {**{name: row for name, row in earlier["arms"].items() if name not in results["arms"]}, **results["arms"]}
    commands = [c for c in earlier.get("commands", [earlier.get("command")]) if c and c != results["command"]]
    return {**results, "arms": arms, "commands": [*commands, results["command"]]}


def cell(row: dict, decoding: str, metric: str) -> str:
    value = row[decoding][metric]
    if isinstance(value, dict):
        return f"{value['mean']:.2f}" if value["min"] == value["max"] else \
            f"{value['mean']:.2f} ({value['min']:.2f}–{value['max']:.2f})"
    return f"{value:.2f}"


def markdown(results: dict, task: str = "summarization", decoding: str = "greedy") -> str:
    """Returns the comparison table (test, `decoding`) in markdown: the `task`'s columns that every row has."""
    rows = {"C": results["C"], **results["arms"]}
    columns = [m for m in COLUMNS[task] if all(m in row[decoding] for row in rows.values())]
    dev = columns[0]
    lines = ["| arm | " + " | ".join(columns) + f" | dev {dev} |", "|---|" + "---|" * (len(columns) + 1)]
    for name, row in rows.items():
        lines.append(f"| {name} | " + " | ".join(cell(row, decoding, m) for m in columns)
                     + f" | {cell(row, 'dev', dev)} |")
    return "\n".join(lines)


def random_comet(device=None, **sizes):
    """Returns a `CometReward` of wmt22-comet-da's architecture (`XLMR_LARGE`, updated with `sizes`) with random
    weights (seed 0) and MiniLM's tokenizer, on `device` (default: the trainer's)."""
    import torch
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    from hf_seqrl.rewards import CometReward
    from hf_seqrl.rewards.comet import CometModel

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    config = XLMRobertaConfig(**{**XLMR_LARGE, **sizes}, pad_token_id=tokenizer.pad_token_id,
                              bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    torch.manual_seed(0)
    encoder = XLMRobertaModel(config, add_pooling_layer=False)
    return CometReward(CometModel(COMET_HPARAMS, encoder, tokenizer), device=device)


def time_reward(reward: str, batch: int, steps: int, quick: bool, data_dir: str | None, work: str,
                device: str = "cpu") -> dict:
    """Returns the step and reward times of `steps` timed SCST steps (after an untimed one) from C with `reward`, on
    `device` (the policy, and the reward's model where it has one)."""
    import torch
    from transformers import TrainerCallback

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    settings = replace(quality.SETTINGS[("summarization", quick)], device=device)
    splits, tokenizer, dataset = quality.task_data(settings, data_dir or quality.DEFAULT_DATA, work)
    folder = quality.c_folder(settings, work)
    if not os.path.isdir(folder):
        raise SystemExit(f"No checkpoint C in {folder}: run the comparison (or quality.py --task summarization) first.")
    model = quality.load_model(settings, folder)
    if reward == "comet":  # COMET reads the sources: the whole abstracts (it truncates them at 512 tokens itself)
        dataset = dataset.add_column("sources", [row["source"] for row in splits["train"]])
        reward_funcs = random_comet(device=device)
    else:
        reward_funcs = quality.arm_reward(replace(settings, reward=reward))
    ends, inside, scored, texts = [], [0.0], [0], []

    class StepEnds(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), 0.0))

        def on_step_end(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), inside[0]))

    args = SeqRLConfig(output_dir=os.path.join(work, "timing"), per_device_train_batch_size=batch, max_steps=steps + 1,
                       learning_rate=1e-7, max_new_tokens=settings.max_new_tokens, report_to=[], save_strategy="no",
                       logging_steps=10**6, disable_tqdm=True, use_cpu=torch.device(device).type == "cpu",
                       dataloader_pin_memory=False, seed=0)
    trainer = SCSTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                          reward_funcs=reward_funcs, callbacks=[StepEnds()])
    reward_values = trainer.reward_values

    def timed(*a, **k):
        start = time.perf_counter()
        out = reward_values(*a, **k)
        inside[0] += time.perf_counter() - start
        scored[0] += len(out.predictions)
        texts.extend(out.predictions)
        return out

    trainer.reward_values = timed
    trainer.train()
    pairs = list(zip(ends, ends[1:]))[1:]
    step_s = [t1 - t0 for (t0, _), (t1, _) in pairs]
    reward_s = [r1 - r0 for (_, r0), (_, r1) in pairs]
    per_step = scored[0] / (steps + 1)  # sampled and greedy sequences scored per step
    row = {"reward": reward, "batch": batch, "threads": torch.get_num_threads(), "step_s": statistics.median(step_s),
           "reward_s": statistics.median(reward_s), "share": statistics.median(r / s for r, s in zip(reward_s, step_s)),
           "scored_per_step": per_step, "ms_per_sample": 1000 * statistics.median(reward_s) / per_step,
           "steps_s": step_s, "rewards_s": reward_s}
    if reward == "comet":  # what COMET encoded: mean tokens (its tokenizer, its truncation) per text of each kind
        tokens = {kind: [len(ids) for ids, _ in reward_funcs.model.tokenize(column)] for kind, column in (
            ("source", [r["source"] for r in splits["train"]]), ("reference", [r["target"] for r in splits["train"]]),
            ("prediction", texts))}
        row["comet_mean_tokens"] = {kind: round(statistics.mean(n), 1) for kind, n in tokens.items()}
    return row


def timing(args) -> dict:
    rows = []
    for batch in args.batch_sizes:
        for reward in args.timed:
            cmd = [sys.executable, __file__, "--_time", reward, str(batch), str(args.steps), "--threads",
                   str(args.threads), "--work-dir", work_dir(args), "--device", args.device] + (
                ["--quick"] if args.quick else [])
            cmd += ["--data-dir", args.data_dir] if args.data_dir else []
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  batch {batch:3d} {reward:18s} step {rows[-1]['step_s']:.2f} s, reward {rows[-1]['reward_s']:.2f} s "
                  f"({100 * rows[-1]['share']:.0f}%)", flush=True)
    return {"timing": rows}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=("summarization", "translation"), default="summarization",
                        help="SciTLDR (the model rewards, their cost, the guards) or Multi30k (the guards against a "
                             "reward a copied source wins: the rows source_embedding and "
                             "scst:source_embedding:guarded)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--rewards", nargs="+", choices=list(ROWS), default=list(REWARDS),
                        help="the rows run (default: the four SCST rewards); the output file's other rows measured "
                             "from the same C are kept")
    parser.add_argument("--timed", nargs="+", choices=(*TIMED, "comet"), default=list(TIMED),
                        help="--timing: the rewards timed (comet only when named)")
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE", help="quality.py settings")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--timing", action="store_true", help="time one SCST step per reward and batch size")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 32])
    parser.add_argument("--steps", type=int, default=3, help="--timing: timed steps per process")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--device", default="cpu", help="--timing: a torch device (cpu, cuda, ...)")
    parser.add_argument("--output", default=None)
    parser.add_argument("--work-dir", default=None, help="the quality benchmark's work folder (C and cached units)")
    parser.add_argument("--_time", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.timing and args.task != "summarization":
        parser.error("--timing times SciTLDR steps (--task summarization): drop --task translation.")
    if args._time:
        import torch

        torch.set_num_threads(args.threads)
        reward, batch, steps = args._time
        print(json.dumps(time_reward(reward, int(batch), int(steps), args.quick, args.data_dir, work_dir(args),
                                     args.device)), flush=True)
        return {}
    start = time.time()
    results = timing(args) if args.timing else compare(args)
    command = "python benchmarks/neural_rewards.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results = {"command": command, "quick": args.quick, "wall_seconds": round(time.time() - start), **results}
    name = "neural_rewards_timing.json" if args.timing else "neural_rewards.json"
    output = args.output or (os.path.join(work_dir(args), name) if args.quick else os.path.join(HERE, "results", name))
    if not args.timing:
        results = keep_other_rows(results, output)
        results["markdown"] = markdown(results, args.task)
        print(results["markdown"])
    return quality.write_json(results, output)


if __name__ == "__main__":
    main()
