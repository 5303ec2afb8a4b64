#!/usr/bin/env python
"""What hf-seqrl's decode, scoring pass and training step cost on an accelerator, in one command.

    python benchmarks/gpu_check.py                      # one GPU (cuda), about 8 minutes
    python benchmarks/gpu_check.py --device cpu --quick # the same checks at tiny shapes, no compilation (a test),
                                                        #   written to a new temporary folder (or --output_dir)

Models have random weights, built from configs at real shapes: t5-small (32,128 tokens), t5-small with NLLB's
256,206-token vocabulary, and a Qwen2-0.5B-shaped decoder-only model (151,936 tokens). Checks:

1. decode: ms per decoded token at 16 / 64 / 256 rows, hf-seqrl's decode (`family.sample`, one sample per
   source) against `generate(do_sample=True)` and, where transformers supports it for the model, `generate` with a
   static cache and `torch.compile` (not with `--quick`); every row runs to the limit.
2. syncs: host syncs per decoded token of hf-seqrl's decode (`counting.SyncCounter`) and, on CUDA, the
   synchronizing calls `torch.cuda.set_sync_debug_mode("warn")` reports.
3. scoring memory: the scoring pass's peak (`max_memory_allocated` above its start; VmHWM on the CPU) over one
   float32 logits tensor of its rows, at the 256k vocabulary, chunked (hf-seqrl's) against the whole-logits path
   (taken on purpose: `heads.whole_logits`, without the warning a model whose head is not recognized gets).
4. SCST step: `SCSTTrainer.training_step` (greedy baseline) in bf16 autocast, t5-small and the 0.5B decoder-only
   model, with and without gradient checkpointing: seconds and peak memory.
5. batch invariance in bf16: the tokens of keyed samples decoded with compaction on and off, and all rows in one
   decode against four decodes of a quarter each (`steps_per_generation` 4 against 1): the share of rows equal.
6. COMET: ms per sample of the native COMET reward at XLM-R-large shape in bf16 (random weights).

Writes gpu_check.json (with the command) and gpu_check.md (the table, with what each row should show on a CPU and
on a GPU) into --output_dir: benchmarks/results for a full run; for --quick a new temporary folder (its tiny-shape
numbers never go into benchmarks/results).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from speed_lib import models as speed_models  # noqa: E402
from counting import SyncCounter  # noqa: E402

FULL = {"seq2seq": dict(arch="t5", d_model=512, layers=6, heads=8, ffn=2048, vocab=32128),
        "seq2seq_256k": dict(arch="t5", d_model=512, layers=6, heads=8, ffn=2048, vocab=256206),
        "causal": dict(arch="qwen2", d_model=896, layers=24, heads=14, ffn=4864, vocab=151936,
                       num_key_value_heads=2)}
QUICK = {"seq2seq": dict(arch="t5", d_model=32, layers=1, heads=2, ffn=64, vocab=512),
         "seq2seq_256k": dict(arch="t5", d_model=32, layers=1, heads=2, ffn=64, vocab=8192),
         "causal": dict(arch="qwen2", d_model=32, layers=1, heads=2, ffn=64, vocab=512, num_key_value_heads=1)}


def build(spec: dict, device: str, seed: int = 0):
    """Returns (model, tokenizer) of `spec`, random weights, on `device`, in train mode."""
    from hf_seqrl.models.tiny import build_tiny_model

    spec = dict(spec)
    vocab = spec.pop("vocab")
    tok = speed_models.word_tokenizer(vocab)
    arch = spec.pop("arch")
    model = build_tiny_model(arch, tokenizer=tok, max_positions=1024, seed=seed, **spec)
    return model.to(device).train(), tok


def batch(rows: int, length: int, vocab: int, device: str, causal: bool) -> dict:
    generator = torch.Generator().manual_seed(rows)
    ids = torch.randint(3, vocab, (rows, length), generator=generator)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}


def timed(device: str, call, repeats: int) -> list[float]:
    """Returns the seconds of `repeats` calls of `call` after one untimed call."""
    times = []
    for i in range(repeats + 1):
        speed_models.synchronize(device)
        start = time.perf_counter()
        call()
        speed_models.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return times


def ms_per_token(device: str, call, repeats: int, new_tokens: int) -> float:
    """Returns the median ms per decoded token of `call`, a decode of `new_tokens` tokens (`timed`)."""
    return 1000 * statistics.median(timed(device, call, repeats)) / new_tokens


class Peak:
    """The peak memory above the start of the context, MiB: the device allocator's, or VmHWM on the CPU."""

    def __init__(self, device: str):
        self.device, self.mib = device, 0.0

    def __enter__(self):
        if speed_models.on_accelerator(self.device):
            self.module = torch.get_device_module(torch.device(self.device).type)
            self.module.synchronize()
            self.module.reset_peak_memory_stats()
            self.base = self.module.memory_allocated()
        else:
            from counting import reset_resident_peak

            self.base = reset_resident_peak()
        return self

    def __exit__(self, *exc):
        if speed_models.on_accelerator(self.device):
            self.module.synchronize()
            self.mib = (self.module.max_memory_allocated() - self.base) / 2**20
        else:
            from counting import resident_peak_bytes

            self.mib = (resident_peak_bytes() - self.base) / 2**20


def decode_model(spec: dict, device: str, new_tokens: int):
    """Returns (model in eval mode, its family, its rollout generation config) of `spec`, every row decoding exactly
    `new_tokens` tokens (EOS suppressed, in `generate`'s config too)."""
    from hf_seqrl.models import family_for

    model, tok = build(spec, device)
    model.eval()
    family = family_for(model)
    config = family.generation_config(model, new_tokens)
    config.suppress_tokens = [1]  # no row ends early
    model.generation_config.suppress_tokens = [1]
    return model, family, config


def check_decode(shapes, device, quick, rows_list, new_tokens, repeats):
    out = []
    for name in ("seq2seq", "causal"):
        model, family, config = decode_model(shapes[name], device, new_tokens)
        for rows in rows_list:
            inputs = batch(rows, 16, shapes[name]["vocab"], device, family.name == "causal")
            row = {"model": name, "rows": rows}
            with torch.no_grad():
                row["hf_seqrl_ms_per_token"] = ms_per_token(
                    device, lambda: family.sample(model, inputs, config), repeats, new_tokens)
                row["generate_ms_per_token"] = ms_per_token(
                    device, lambda: family.generate(model, inputs, **sampling(new_tokens)), repeats, new_tokens)
                counter = SyncCounter()
                with counter, counter.counting():
                    rollout = family.sample(model, inputs, config)
                row["syncs_per_token"] = counter.total / rollout.sample_ids.shape[1]
                if torch.device(device).type == "cuda":
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        torch.cuda.set_sync_debug_mode("warn")
                        try:
                            family.sample(model, inputs, config)
                        finally:
                            torch.cuda.set_sync_debug_mode("default")
                    row["cuda_sync_warnings_per_token"] = len(caught) / rollout.sample_ids.shape[1]
            out.append(row)
        del model
    return out


def sampling(new_tokens: int) -> dict:
    """`generate`'s arguments for plain sampling of exactly `new_tokens` tokens."""
    return dict(do_sample=True, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


def check_decode_compiled(shapes, device, rows, new_tokens, repeats):
    """`generate` with a static cache and a compiled forward, beside hf-seqrl's decode at the same shape: the last
    check, since compiling takes minutes and a model transformers gives no static cache fails it."""
    out = []
    for name in ("seq2seq", "causal"):
        model, family, config = decode_model(shapes[name], device, new_tokens)
        inputs = batch(rows, 16, shapes[name]["vocab"], device, family.name == "causal")
        row = {"model": name, "rows": rows}
        with torch.no_grad():
            row["hf_seqrl_ms_per_token"] = ms_per_token(
                device, lambda: family.sample(model, inputs, config), repeats, new_tokens)
            static = dict(sampling(new_tokens), cache_implementation="static")
            try:
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)
                started = time.perf_counter()
                family.generate(model, inputs, **static)  # compiles
                row["compile_s"] = time.perf_counter() - started
                row["generate_static_compiled_ms_per_token"] = ms_per_token(
                    device, lambda: family.generate(model, inputs, **static), repeats, new_tokens)
            except Exception as error:  # a model transformers gives no static cache
                row["generate_static_compiled"] = f"unsupported: {type(error).__name__}: {str(error)[:120]}"
            finally:
                model.__dict__.pop("forward", None)
        out.append(row)
        del model
    return out


def check_scoring_memory(shapes, device, rows, length):
    from hf_seqrl.models import family_for, heads

    model, tok = build(shapes["seq2seq_256k"], device)
    family, vocab = family_for(model), shapes["seq2seq_256k"]["vocab"]
    inputs = batch(rows, 32, vocab, device, False)
    sample_ids = torch.randint(3, vocab, (rows, length)).to(device)
    logits_mib = rows * length * vocab * 4 / 2**20
    out = {"rows": rows, "tokens": length, "vocab": vocab, "logits_mib": logits_mib}
    for arm in ("chunked", "whole_logits"):
        model.zero_grad(set_to_none=True)
        with Peak(device) as peak, heads.whole_logits(arm == "whole_logits"):  # the whole logits on purpose
            scored = family.score(model, inputs, sample_ids, 1, temperature=1.0)
            scored.token_logprobs.sum().backward()
        out[f"{arm}_peak_mib"] = peak.mib
        out[f"{arm}_over_logits"] = peak.mib / logits_mib
    return out


def check_scst_step(shapes, device, batch_size, new_tokens, repeats):
    out = []
    bf16 = True  # autocast over float32 weights, on the CPU too
    for name in ("seq2seq", "causal"):
        for checkpointing in (False, True):
            model, tok = build(shapes[name], device)
            if checkpointing:
                model.gradient_checkpointing_enable()
            trainer = scst_trainer(model, tok, device, new_tokens, bf16)
            inputs = batch(batch_size, 32, shapes[name]["vocab"], device, name == "causal")
            inputs["references"] = ["w3 w4 w5"] * batch_size
            if name == "causal":
                inputs["labels"] = torch.full_like(inputs["input_ids"], -100)
                inputs["labels"][:, -4:] = inputs["input_ids"][:, -4:]
            with Peak(device) as peak:
                times = timed(device, lambda: trainer.training_step(model, dict(inputs)), repeats)
            out.append({"model": name, "gradient_checkpointing": checkpointing, "bf16": bf16,
                        "step_s": statistics.median(times), "peak_mib": peak.mib})
            del trainer, model
    return out


def scst_trainer(model, tok, device, new_tokens, bf16):
    from datasets import Dataset

    from hf_seqrl import SCSTTrainer, SeqRLConfig

    args = SeqRLConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=1, max_new_tokens=new_tokens,
                       report_to=[], save_strategy="no", logging_steps=10**6, disable_tqdm=True, bf16=bf16,
                       use_cpu=not speed_models.on_accelerator(device), dataloader_pin_memory=False, seed=0)
    placeholder = Dataset.from_dict({"input_ids": [[3, 1]], "references": ["w3"]})
    trainer = SCSTTrainer(model=model, args=args, train_dataset=placeholder, processing_class=tok,
                          reward_funcs="chrf")
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    trainer.current_gradient_accumulation_steps = 1  # what `train()` sets before its first step
    return trainer


def check_batch_invariance(shapes, device, rows, new_tokens):
    from hf_seqrl.functional.sampling import row_keys, rollout_uniforms
    from hf_seqrl.models.base import DecodeSettings
    from hf_seqrl.models.seq2seq import decode, rollout_generation_config

    model, tok = build(shapes["seq2seq"], device)
    model.eval()
    vocab = shapes["seq2seq"]["vocab"]
    config = rollout_generation_config(model, max_new_tokens=new_tokens)
    config.eos_token_id = list(range(1, 1 + vocab // 16))  # one token in 16 ends a row: rows end at many lengths
    settings = DecodeSettings.from_generation_config(config)
    inputs = batch(rows, 24, vocab, device, False)
    keys = row_keys(7, 0, rows, device)
    uniforms = rollout_uniforms(new_tokens, rows, device, keys)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16)

    def run(ids, mask, u, compact):
        with torch.no_grad(), autocast:
            return decode(model, ids, mask, settings, 1, False, u, compact_below=compact)

    def same(a, b):
        width = max(a.shape[1], b.shape[1])
        pad = lambda x: torch.nn.functional.pad(x, (0, width - x.shape[1]), value=0)  # noqa: E731
        return (pad(a) == pad(b)).all(dim=1).float().mean().item()

    whole = run(inputs["input_ids"], inputs["attention_mask"], uniforms, 0.5)
    uncompacted = run(inputs["input_ids"], inputs["attention_mask"], uniforms, 0.0)
    quarter = rows // 4
    parts = [run(inputs["input_ids"][i:i + quarter], inputs["attention_mask"][i:i + quarter],
                 uniforms[:, i:i + quarter], 0.5) for i in range(0, rows, quarter)]
    width = max(p.shape[1] for p in parts)
    joined = torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=0) for p in parts])
    lengths = (whole != 0).sum(dim=1).float()
    return {"rows": rows, "mean_length": lengths.mean().item(),
            "equal_rows_compaction_on_vs_off": same(whole, uncompacted),
            "equal_rows_one_decode_vs_four": same(whole, joined)}


def check_comet(device, quick, samples):
    from transformers import XLMRobertaConfig, XLMRobertaModel

    from hf_seqrl.rewards.comet import CometModel, load_tokenizer
    from hf_seqrl.rewards.neural import CometReward

    fixture = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "comet", "encoder-xlmr")
    tokenizer = load_tokenizer(fixture)
    size = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64) if quick else dict(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    config = XLMRobertaConfig(vocab_size=max(len(tokenizer), 250002 if not quick else 0), max_position_embeddings=514,
                              **size)
    torch.manual_seed(0)
    encoder = XLMRobertaModel(config, add_pooling_layer=False)
    hparams = {"class_identifier": "regression_metric", "layer": "mix", "pool": "avg", "hidden_sizes": [3072, 1024],
               "activations": "Tanh", "layer_transformation": "sparsemax", "layer_norm": False}
    dtype = torch.bfloat16
    comet = CometModel(hparams, encoder, tokenizer)
    reward = CometReward(comet, batch_size=64, device=device, dtype=dtype)
    words = "a small dog runs across the green field towards its owner while children play".split()
    predictions = [" ".join(words[i % 5:]) for i in range(samples)]
    references = [[" ".join(words)] for _ in range(samples)]
    sources = [" ".join(reversed(words)) for _ in range(samples)]
    times = timed(device, lambda: reward(predictions, references, sources), 2)
    return {"shape": "tiny" if quick else "xlm-roberta-large", "dtype": "bfloat16", "samples": samples,
            "ms_per_sample": 1000 * statistics.median(times) / samples}


# What each row of the table should show, on a CPU (`--device cpu`, peaks are the process's resident memory) and on a
# GPU (peaks are the allocator's), when the code does what it is meant to.
EXPECTED = {
    "decode ms/token, hf-seqrl": (
        "below the generate(do_sample) row of the same rows",
        "below the generate(do_sample) row of the same rows"),
    "decode ms/token, generate(do_sample)": ("the reference of the row above", "the reference of the row above"),
    "host syncs / token, hf-seqrl decode": (
        "one read per 4 tokens plus a few per decode: 1.25 at --quick's 4 tokens, about 0.4 at 32",
        "the same as on a CPU (the count does not depend on the device)"),
    "CUDA sync warnings / token": ("not measured", "close to the host syncs row"),
    "scoring pass peak / logits, chunked": (
        "host RSS (VmHWM): at --quick's 1 MiB of logits the allocator's noise, so it may read above the whole-logits "
        "row; at full shape below 1 and below that row",
        "below 1 and below the whole-logits row: a slice of the vocabulary at a time"),
    "scoring pass peak / logits, whole logits": (
        "host RSS: noise at --quick shapes; at full shape above 1 (the logits, their softmax and gradient)",
        "above 1 and above the chunked row (the logits, their softmax and gradient)"),
    "SCST step s (peak MiB)": (
        "checkpointing on: more seconds, a peak at or below off's (host RSS, noise at --quick shapes)",
        "checkpointing on: more seconds, a lower peak than off's"),
    "bf16 rows equal, compaction on vs off": (
        "1.000", "1.000; below 1: bf16 kernels give a row other values at another batch size"),
    "bf16 rows equal, one decode vs four": (
        "1.000", "1.000; below 1: bf16 kernels give a row other values at another batch size"),
    "COMET ms/sample": ("a tiny encoder at --quick: says nothing of the real one",
                        "the cost of a COMET reward per sample at XLM-R-large shape"),
    "decode ms/token, hf-seqrl (beside the compiled arm)": ("not run with --quick", "compare with the row below"),
    "decode ms/token, generate static cache + compile": ("not run with --quick", "generate at its fastest"),
    "decode, generate static cache + compile": ("not run with --quick", "unsupported for this model in transformers"),
}
LEGEND = ("Expected values: the last two columns say what a healthy run shows on a CPU and on a GPU. On a CPU the "
          "peaks are the process's resident memory (VmHWM), in which allocator noise hides a tensor of a few MiB; "
          "`--quick`'s tiny shapes say nothing about a GPU.")


def markdown(results: dict) -> str:
    """The table of the checks in `results`, each row with what it should show on a CPU and on a GPU (`EXPECTED`); a
    check that failed is one row with its error."""
    lines = [LEGEND, "", "| check | setting | value | expected on CPU | expected on GPU |", "|---|---|---|---|---|"]

    def add(check: str, setting: str, value: str):
        cpu, gpu = EXPECTED.get(check, ("", ""))
        lines.append(f"| {check} | {setting} | {value} | {cpu} | {gpu} |")

    for name, error in results.get("errors", {}).items():
        lines.append(f"| {name} | failed | {error} | | |")
    for row in results.get("decode", []):
        setting = f"{row['model']}, {row['rows']} rows"
        add("decode ms/token, hf-seqrl", setting, f"{row['hf_seqrl_ms_per_token']:.2f}")
        add("decode ms/token, generate(do_sample)", setting, f"{row['generate_ms_per_token']:.2f}")
        add("host syncs / token, hf-seqrl decode", setting, f"{row['syncs_per_token']:.2f}")
        if "cuda_sync_warnings_per_token" in row:
            add("CUDA sync warnings / token", setting, f"{row['cuda_sync_warnings_per_token']:.2f}")
    if "scoring_memory" in results:
        mem = results["scoring_memory"]
        setting = f"{mem['rows']} rows x {mem['tokens']} tokens, vocab {mem['vocab']}"
        for arm in ("chunked", "whole_logits"):
            add(f"scoring pass peak / logits, {arm.replace('_', ' ')}", setting,
                f"{mem[f'{arm}_over_logits']:.2f} ({mem[f'{arm}_peak_mib']:.0f} MiB)")
    for row in results.get("scst_step", []):
        setting = f"{row['model']}, bf16, checkpointing {'on' if row['gradient_checkpointing'] else 'off'}"
        add("SCST step s (peak MiB)", setting, f"{row['step_s']:.3f} ({row['peak_mib']:.0f})")
    if "batch_invariance" in results:
        inv = results["batch_invariance"]
        add("bf16 rows equal, compaction on vs off", f"{inv['rows']} rows",
            f"{inv['equal_rows_compaction_on_vs_off']:.3f}")
        add("bf16 rows equal, one decode vs four", f"{inv['rows']} rows", f"{inv['equal_rows_one_decode_vs_four']:.3f}")
    if "comet" in results:
        comet = results["comet"]
        add("COMET ms/sample", f"{comet['shape']}, {comet['dtype']}, {comet['samples']} samples",
            f"{comet['ms_per_sample']:.2f}")
    for row in results.get("decode_compiled", []):
        setting = f"{row['model']}, {row['rows']} rows"
        add("decode ms/token, hf-seqrl (beside the compiled arm)", setting, f"{row['hf_seqrl_ms_per_token']:.2f}")
        if "generate_static_compiled_ms_per_token" in row:
            add("decode ms/token, generate static cache + compile", setting,
                f"{row['generate_static_compiled_ms_per_token']:.2f} (compiled in {row['compile_s']:.0f} s)")
        else:
            add("decode, generate static cache + compile", setting, row["generate_static_compiled"])
    return "\n".join(lines) + "\n"


def write(results: dict, output: str, started: float) -> str:
    """Writes `output` (JSON) and its markdown table beside it; returns the table."""
    results["wall_s"] = round(time.perf_counter() - started, 1)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(results, f, indent=1)
    table = markdown(results)
    with open(os.path.splitext(output)[0] + ".md", "w") as f:
        f.write(f"`{results['command']}` on {results['device_name']}, torch {results['torch']}, "
                f"{results['wall_s']:.0f} s\n\n" + table)
    return table


RESULTS = os.path.join(HERE, "results")


def parse_args(argv=None) -> argparse.Namespace:
    """Returns the arguments, `output` set to the JSON file to write: in `--output_dir`, else benchmarks/results for a
    full run and a new temporary folder for `--quick`, whose tiny-shape numbers benchmarks/results never holds."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="a torch device: cuda, cuda:1, cpu, ...")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, no compilation (what the tests run)")
    parser.add_argument("--no-compile", action="store_true", help="leave out generate with a compiled static cache")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--output_dir", help="the folder of gpu_check.json and gpu_check.md (default: "
                                            "benchmarks/results; with --quick, a new temporary folder)")
    where.add_argument("--output", help="the JSON file to write, the table beside it (instead of --output_dir)")
    args = parser.parse_args(argv)
    if args.output is None:
        folder = args.output_dir or (tempfile.mkdtemp(prefix="gpu_check_quick_") if args.quick else RESULTS)
        args.output = os.path.join(folder, "gpu_check.json")
    results = os.path.realpath(RESULTS)
    inside = os.path.commonpath([os.path.realpath(args.output), results]) == results
    if args.quick and inside:
        parser.error(f"--quick writes tiny-shape numbers, which say nothing about a GPU: name a folder outside "
                     f"{RESULTS} with --output_dir (or leave it out for a temporary folder).")
    return args


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    quick = args.quick
    shapes = QUICK if quick else FULL
    torch.manual_seed(0)
    results = {
        "device": args.device, "quick": quick, "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else args.device,
        "command": " ".join(["python", "benchmarks/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]),
        "errors": {}}
    steps = [
        ("decode", lambda: check_decode(shapes, args.device, quick, (4, 8) if quick else (16, 64, 256),
                                        4 if quick else 32, 1 if quick else 3)),
        ("scoring_memory", lambda: check_scoring_memory(shapes, args.device, 4 if quick else 64,
                                                        8 if quick else 128)),
        ("scst_step", lambda: check_scst_step(shapes, args.device, 2 if quick else 16, 4 if quick else 32,
                                              1 if quick else 3)),
        ("batch_invariance", lambda: check_batch_invariance(shapes, args.device, 8 if quick else 64,
                                                            8 if quick else 48)),
        ("comet", lambda: check_comet(args.device, quick, 4 if quick else 64)),
    ]
    if not (quick or args.no_compile):
        steps.append(("decode_compiled", lambda: check_decode_compiled(shapes, args.device, 64, 32, 3)))
    for name, run in steps:
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr):  # the trainers' prints stay out of the table
                results[name] = run()
        except Exception as error:  # one check's failure keeps the others' numbers
            if quick:
                raise
            results["errors"][name] = f"{type(error).__name__}: {str(error)[:200]}"
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        if speed_models.on_accelerator(args.device):
            torch.get_device_module(torch.device(args.device).type).empty_cache()
        table = write(results, args.output, started)  # a run stopped later keeps the checks done
    print(table)
    print(f"wrote {args.output} ({results['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
