"""Times the decoder-only rollout decode (`hf_seqrl.models.causal.decode_causal`) with each prompt read once per source
and its KV cache copied to the source's sample rows ("cache shared"), against each prompt read once per row in the
first forward call ("prompt read per row"): the choice `CausalSteps.first` makes by
`hf_seqrl.models.causal.PROMPT_CACHE_MIN_TOKENS`.

Protocol: a 2-layer, width-64 Llama (2 heads, FFN 128, 384-token vocabulary) built from a config with random weights
(`hf_seqrl.models.tiny.build_tiny_model`, seed 0), in eval mode; 4 prompts of `--prompt-tokens` random tokens each
(no padding), 4 samples per prompt (`group=4`, 16 rows), 12 new tokens sampled at temperature 1 from the model's own
distribution (`causal_generation_config`). The decode's EOS id is one past the vocabulary, so no row ever ends:
every row runs to the 12-token limit. The two arms run in one process, selected by setting `PROMPT_CACHE_MIN_TOKENS`
to 2 (every prompt shares its cache) or to `sys.maxsize` (every prompt is read per row). For each prompt length: one
untimed decode per arm (which also counts the model's forward calls, one more with the cache shared), then
`--rounds` rounds of one timed decode per arm, alternating A B A B. Every decode starts from the same seed, so both
arms draw the same uniforms: their completion ids must be the same token for token, which is asserted and recorded.
Reports the median milliseconds per decode of each arm and their ratio (shared / per row).

    python benchmarks/prompt_cache.py                  # prints a table, writes results/prompt_cache.json
    python benchmarks/prompt_cache.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ARMS = {"shared": 2, "per_row": sys.maxsize}  # arm: the PROMPT_CACHE_MIN_TOKENS that selects it
LABELS = {"shared": "cache shared", "per_row": "prompt read per row"}
VOCAB, WIDTH, LAYERS, PROMPTS, GROUP, NEW_TOKENS, SEED = 384, 64, 2, 4, 4, 12, 0


def build_model(device: str):
    """Returns the random-weight Llama in eval mode on `device` (pad 0, EOS 1)."""
    from hf_seqrl.models.tiny import build_tiny_model

    model = build_tiny_model("llama", vocab_size=VOCAB, d_model=WIDTH, layers=LAYERS, max_positions=128,
                             pad_token_id=0, eos_token_id=1, seed=0)
    return model.to(device).eval()


def decode(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, config, arm: str, device: str):
    """Returns `(completion ids, mask, seconds)` of one `decode_causal` in `arm`, from seed `SEED`."""
    from speed_lib.models import synchronize

    from hf_seqrl.models import causal

    saved = causal.PROMPT_CACHE_MIN_TOKENS
    causal.PROMPT_CACHE_MIN_TOKENS = ARMS[arm]
    try:
        torch.manual_seed(SEED)
        synchronize(device)
        start = time.perf_counter()
        ids, mask = causal.decode_causal(model, prompt_ids, prompt_mask, config, group=GROUP)
        synchronize(device)
        seconds = time.perf_counter() - start
    finally:
        causal.PROMPT_CACHE_MIN_TOKENS = saved
    return ids, mask, seconds


def measure(model, config, prompt_tokens: int, rounds: int, device: str) -> dict:
    """Returns the row of one prompt length: each arm's forward calls, samples (ms) and median, and whether every
    decode wrote the same completion ids."""
    generator = torch.Generator(device=device).manual_seed(prompt_tokens)
    prompt_ids = torch.randint(2, VOCAB, (PROMPTS, prompt_tokens), generator=generator, device=device)
    prompt_mask = torch.ones(PROMPTS, prompt_tokens, dtype=torch.bool, device=device)
    calls = {}
    reference = None
    identical, full = True, True

    def check(ids: torch.Tensor, mask: torch.Tensor) -> None:
        nonlocal reference, identical, full
        full = full and ids.shape == (PROMPTS * GROUP, NEW_TOKENS) and bool(mask.all())
        if reference is None:
            reference = ids
        else:
            identical = identical and torch.equal(ids, reference)

    for arm in ARMS:  # warm-up, counting the model's forward calls
        count = [0]
        hook = model.register_forward_pre_hook(lambda module, args: count.__setitem__(0, count[0] + 1))
        try:
            ids, mask, _ = decode(model, prompt_ids, prompt_mask, config, arm, device)
        finally:
            hook.remove()
        calls[arm] = count[0]
        check(ids, mask)
    samples = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            ids, mask, seconds = decode(model, prompt_ids, prompt_mask, config, arm, device)
            samples[arm].append(seconds * 1000)
            check(ids, mask)
    row = {"prompt_tokens": prompt_tokens, "identical_outputs": identical, "all_rows_full": full,
           "forward_calls": calls}
    for arm in ARMS:
        row[f"{arm}_ms"] = statistics.median(samples[arm])
        row[f"{arm}_samples_ms"] = samples[arm]
    row["shared_over_per_row"] = row["shared_ms"] / row["per_row_ms"]
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[15, 31, 63])
    parser.add_argument("--rounds", type=int, default=20, help="timed decodes per arm, alternating A B A B")
    parser.add_argument("--device", default="cpu", help="a torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=os.path.join(HERE, "results", "prompt_cache.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    from hf_seqrl.models import causal

    started = time.perf_counter()
    model = build_model(args.device)
    config = causal.causal_generation_config(model, NEW_TOKENS)
    config.eos_token_id = VOCAB  # an id no sample can take: every row runs to the limit
    rows = []
    print(f"| prompt tokens | {LABELS['shared']} | {LABELS['per_row']} | shared / per row | identical outputs |")
    print("|---|---|---|---|---|")
    for prompt_tokens in args.prompt_tokens:
        row = measure(model, config, prompt_tokens, args.rounds, args.device)
        rows.append(row)
        print(f"| {prompt_tokens} | {row['shared_ms']:.1f} ms | {row['per_row_ms']:.1f} ms | "
              f"{row['shared_over_per_row']:.2f}x | {'yes' if row['identical_outputs'] else 'NO'} |", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
                   "threads": args.threads, "rounds": args.rounds,
                   "command": " ".join(["python", "benchmarks/prompt_cache.py", *sys.argv[1:]]),
                   "settings": {"prompt_tokens": args.prompt_tokens, "prompts": PROMPTS, "group": GROUP,
                                "max_new_tokens": NEW_TOKENS, "layers": LAYERS, "width": WIDTH, "vocab": VOCAB,
                                "arms_min_tokens": {arm: ARMS[arm] for arm in ARMS},
                                "library_min_tokens": causal.PROMPT_CACHE_MIN_TOKENS},
                   "wall_s": round(time.perf_counter() - started, 1), "rows": rows}, f, indent=1)
    print(f"wrote {args.output}")
    bad = [row["prompt_tokens"] for row in rows if not (row["identical_outputs"] and row["all_rows_full"])]
    assert not bad, f"the arms' completion ids differ, or a row ended early, at prompt tokens {bad}"
    assert all(row["forward_calls"]["shared"] == row["forward_calls"]["per_row"] + 1 for row in rows), rows


if __name__ == "__main__":
    main()
