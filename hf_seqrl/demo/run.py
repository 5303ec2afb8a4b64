"""Runs the demo: prints the comparison table and saves the SCST model, its card, the results and the held-out split."""

from __future__ import annotations

import json
import os

from .arms import ARM_TITLES, ARMS, compare
from .task import FULL, QUICK, DemoSettings

RESULTS_FILE = "demo_results.json"
# The held-out split (`source`, and every reference in `target`, the CLI's default columns), for
# `hf-seqrl evaluate` / `hf-seqrl diagnose --model DIR --data DIR/heldout_test.jsonl`.
HELDOUT_FILE = "heldout_test.jsonl"


def format_report(results: dict) -> str:
    """Returns the held-out comparison table, the warm-up's dev history and one example, as text."""
    lines = ["", f"{'held-out test: greedy, all references':<40}{'steps':>7}{'BLEU':>8}{'chrF':>8}{'seconds':>9}"]
    for arm in ARMS:
        row = results["arms"][arm]
        lines.append(f"{ARM_TITLES[arm]:<40}{row['steps']:>7}{row['bleu']:>8.1f}{row['chrf']:>8.1f}"
                     f"{row['seconds']:>9.0f}")
    history = ", ".join(f"{step}: {bleu:.1f}" for step, bleu in results["warmup"]["dev_bleu_history"])
    example = results["task"]["example"]
    lines += ["", f"warm-up dev BLEU by step ({results['warmup']['criterion']}):", f"  {history}", "",
              f"source      {example['source']}"]
    lines += [f"reference   {ref}" for ref in example["references"]]
    lines += [f"{arm:<12}{results['arms'][arm]['example_output']}" for arm in ARMS]
    return "\n".join(lines)


def run_demo(output_dir: str, seed: int = 0, quick: bool = False) -> dict:
    """Runs the demo, prints the comparison table, saves the SCST model and `demo_results.json`.

    `quick=True` runs a much smaller version (under a minute), for tests. Returns the results: per arm
    (`warmup` = checkpoint C, `scst`, `xe`) the optimizer steps, held-out BLEU / chrF, wall seconds of the
    phase (with its evaluations) and the translation of one test source; plus the task, settings and the
    warm-up record.
    """
    return run_with_settings(output_dir, seed, QUICK if quick else FULL, quick=quick)


def run_with_settings(output_dir: str, seed: int, settings: DemoSettings, quick: bool = False) -> dict:
    """`run_demo` with explicit `settings` (to try other sizes and hyper-parameters)."""
    import torch

    threads = torch.get_num_threads()
    # Tiny matrices gain nothing from threads, and OpenMP threads competing with other processes for
    # the same cores make every step many times slower; one thread also leaves CPU to others.
    torch.set_num_threads(1)
    try:
        results, model, tokenizer, test_rows = compare(seed, settings)
    finally:
        torch.set_num_threads(threads)
    results["quick"] = quick
    print(format_report(results))
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    with open(os.path.join(output_dir, RESULTS_FILE), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(output_dir, HELDOUT_FILE), "w") as f:
        for row in test_rows:
            f.write(json.dumps({"source": row["source"], "target": row["references"]}) + "\n")
    write_card(output_dir, results, settings)
    return results


def write_card(output_dir: str, results: dict, settings: DemoSettings) -> str:
    """Writes the model card of the saved SCST model (from `model_cards/`) and returns its path."""
    from ..hub import write_model_card
    from ..trainers import SCSTTrainer
    from ..objectives.policy_gradient import policy_gradient_method

    arms = results["arms"]
    metrics = {f"test_{metric}_{arm}": arms[arm][metric] for arm in ARMS for metric in ("bleu", "chrf")}
    rewards = arms["scst"].get("train_rewards") or []
    return write_model_card(
        output_dir, model_name="hf-seqrl-demo-scst", method=policy_gradient_method(settings.baseline or SCSTTrainer.default_baseline),
        task="translation",
        datasets=[f"generated three-dialect toy translation (hf-seqrl demo, seed {results['seed']})"],
        reward="bleu",
        settings={"warmup_xe_steps (C)": results["warmup"]["steps"], "rl_steps": settings.compare_steps,
                  "num_samples": settings.num_samples, "rl_weight": settings.rl_weight,
                  "learning_rate": settings.lr, "per_device_train_batch_size": settings.batch_size},
        metrics=metrics, curve=[("rl/reward", rewards[0], rewards[-1])] if rewards else [],
        repo_id=output_dir, example_input=results["task"]["example"]["source"],
        algorithm_detail="from a cross-entropy checkpoint that had plateaued",
    )
