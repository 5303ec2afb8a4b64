"""The recipes' pipeline (hf_seqrl.cli.train) run in-process on the tiny offline configs, plus its parsing and data.

Each end-to-end test trains a tiny model from `recipes/configs/tiny_offline_*.yaml` for a few steps (CLI overrides
shorten the run), evaluates on the test split with generation and checks the returned metrics, the saved model
and its card.
"""

from __future__ import annotations

import json
import math
import runpy
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from hf_seqrl.data import read_text_pairs
from hf_seqrl.cli.train import load_splits, parse_args, train_main

from helpers import REPO

CONFIGS = REPO / "recipes" / "configs"
TRANSLATION = str(CONFIGS / "tiny_offline_translation.yaml")
SUMMARIZATION = str(CONFIGS / "tiny_offline_summarization.yaml")
# A short run: 2 teacher-forced steps, then 2 RL steps; small evaluation splits.
SHORT = ["--max_steps", "4", "--warmup_xe_steps", "2", "--num_samples", "2", "--tiny_d_model", "32",
         "--eval_strategy", "no", "--max_eval_samples", "8", "--max_test_samples", "8", "--logging_steps", "2"]


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # the configs name their data files relative to the repository root


def card_of(out: Path) -> tuple[dict, str]:
    text = (out / "README.md").read_text()
    return yaml.safe_load(text.split("---\n")[1]), text


def logged(out: Path) -> list[dict]:
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


# ---- end to end -------------------------------------------------------------------------------------------------

def test_translation_pipeline(tmp_path):
    out = tmp_path / "translation"
    metrics = train_main(["--config", TRANSLATION, "--output_dir", str(out), *SHORT])
    # corpus BLEU / chrF (0-100) on the test split (two references per source) and on the validation split
    for prefix in ("eval", "test"):
        assert 0.0 <= metrics[f"{prefix}_bleu"] <= 100.0 and 0.0 <= metrics[f"{prefix}_chrf"] <= 100.0
        assert 0.0 <= metrics[f"{prefix}_rl/reward"] <= 1.0 and metrics[f"{prefix}_gen_len"] >= 0
    assert math.isfinite(metrics["train_loss"])
    assert json.loads((out / "all_results.json").read_text()) == pytest.approx(metrics)
    # warm-up then RL actually ran, with the rl/* metrics logged
    history = logged(out)
    train_logs = [h for h in history if "loss" in h]
    assert [h["rl/phase"] for h in train_logs] == [0.0, 1.0]
    assert 0.0 <= train_logs[-1]["rl/reward"] <= 1.0
    # saved model (loadable, different from a fresh init), tokenizer and card
    weights = load_file(out / "model.safetensors")
    assert any(torch.is_floating_point(w) and w.abs().sum() > 0 for w in weights.values())
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(out)
    assert model.config.model_type == "t5"
    assert (out / "tokenizer_config.json").exists()
    meta, card = card_of(out)
    # the config runs the SCST trainer with the leave-one-out baseline, which the card names
    assert meta["pipeline_tag"] == "translation" and "rloo" in meta["tags"]
    assert "- Algorithm: REINFORCE with leave-one-out baseline" in card and "- Reward: `chrf`" in card
    assert "- Baseline: `mean`" in card
    assert "| `eval_chrf` |" in card


def test_summarization_recipe_with_reinforce(tmp_path):
    # The recipe file itself, in-process; the algorithm is overridden on the command line.
    recipe = runpy.run_path(str(REPO / "recipes" / "summarization.py"), run_name="recipe")
    out = tmp_path / "summarization"
    metrics = recipe["main"](["--config", SUMMARIZATION, "--output_dir", str(out), "--algorithm", "reinforce",
                              "--baseline", "moving_average", *SHORT])
    for name in ("rouge1", "rouge2", "rougeL"):  # rouge-score F1 x 100, best of the two references
        assert 0.0 <= metrics[f"test_{name}"] <= 100.0
    assert metrics["test_rouge2"] <= metrics["test_rouge1"] + 1e-9
    assert (out / "model.safetensors").exists()
    meta, card = card_of(out)
    assert meta["pipeline_tag"] == "summarization"
    assert "- Algorithm: REINFORCE" in card and "- Reward: `rougeL`" in card
    assert "- Baseline: `moving_average`" in card


def test_scheduled_sampling_from_an_rl_config(tmp_path):
    # The RL settings of the YAML do not apply to scheduled sampling: ignored with a warning, not an error.
    out = tmp_path / "ss"
    with pytest.warns(UserWarning, match="do not apply to algorithm='scheduled_sampling'"):
        metrics = train_main(["--config", TRANSLATION, "--output_dir", str(out), "--algorithm", "scheduled_sampling",
                              "--schedule", "linear", "--schedule_k", "4", "--max_steps", "3", "--warmup_xe_steps", "1",
                              "--logging_steps", "1", "--tiny_d_model", "32",
                              "--eval_strategy", "no", "--validation_file", "", "--max_test_samples", "4"])
    assert "test_chrf" in metrics and "eval_chrf" not in metrics
    assert any("ss/teacher_forcing_ratio" in h for h in logged(out))
    assert "- Algorithm: Scheduled sampling" in card_of(out)[1]


# algorithm -> (its own settings on the command line, a metric it logs, the algorithm line of its card)
OTHER_ALGORITHMS = {
    "mrt": (["--num_samples", "2", "--mrt_include_greedy", "true", "--mrt_alpha", "0.5", "--max_new_tokens", "8"],
            "mrt/risk", "Minimum risk training"),
    "mixer": (["--num_samples", "2", "--mixer_delta", "2", "--max_new_tokens", "8"], "mixer/delta", "MIXER"),
    "prefix_corruption": (["--corruption_rate", "0.3", "--per_token_levels", "true"], "pc/replaced_fraction",
                          "Noise-level forcing"),
    "kstep_rollout": (["--rollout_steps", "2"], "ks/own_token_accuracy", "k-step rollout"),
    "professor_forcing": (["--discriminator_hidden_size", "8", "--max_new_tokens", "8"], "pf/d_loss",
                          "Professor forcing"),
}


@pytest.mark.parametrize("algorithm", sorted(OTHER_ALGORITHMS))
def test_every_algorithm_runs_through_the_pipeline(tmp_path, algorithm):
    """`--algorithm` picks any trainer; a config written for SCST keeps working (its RL-only settings are ignored
    with a warning where the algorithm has no such field)."""
    settings, metric, title = OTHER_ALGORITHMS[algorithm]
    config = yaml.safe_load(Path(TRANSLATION).read_text())
    config.pop("baseline")  # MRT has none; the others default to their own
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / algorithm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the SCST settings the input-schedule configs do not have
        metrics = train_main(["--config", str(path), "--output_dir", str(out), "--algorithm", algorithm,
                              "--max_steps", "3", "--warmup_xe_steps", "1", "--tiny_d_model", "32",
                              "--logging_steps", "1", "--eval_strategy", "no",
                              "--validation_file", "", "--max_test_samples", "4", *settings])
    assert math.isfinite(metrics["test_chrf"])
    assert any(metric in h for h in logged(out))
    assert f"- Algorithm: {title}" in card_of(out)[1]
    assert (out / "model.safetensors").exists()


def test_resume_from_checkpoint_continues_the_run(tmp_path):
    common = ["--config", TRANSLATION, "--tiny_d_model", "32", "--warmup_xe_steps", "1", "--num_samples", "2",
              "--data_seed", "0",
              "--lr_scheduler_type", "constant", "--eval_strategy", "no", "--validation_file", "",
              "--test_file", "", "--save_strategy", "steps", "--save_steps", "2", "--logging_steps", "1"]
    train_main([*common, "--output_dir", str(tmp_path / "full"), "--max_steps", "4"])
    interrupted = tmp_path / "interrupted"
    train_main([*common, "--output_dir", str(interrupted), "--max_steps", "2"])
    assert (interrupted / "checkpoint-2").is_dir()
    # "true": the last checkpoint of output_dir. Another seed: from scratch it would build other initial weights;
    # resumed, the weights and random states come from the checkpoint.
    train_main([*common, "--output_dir", str(interrupted), "--max_steps", "4", "--resume_from_checkpoint", "true",
                "--seed", "1"])
    assert min(h["step"] for h in logged(interrupted) if "loss" in h) <= 2  # history carried over from the checkpoint
    full, resumed = load_file(tmp_path / "full" / "model.safetensors"), load_file(interrupted / "model.safetensors")
    for name in full:
        torch.testing.assert_close(resumed[name], full[name], atol=1e-6, rtol=1e-6)


# ---- parsing: YAML + CLI ------------------------------------------------------------------------------------------

def write_yaml(tmp_path, **values) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def test_cli_overrides_yaml_which_overrides_recipe_defaults(tmp_path):
    config = write_yaml(tmp_path, tiny_model="t5", train_file="x.txt", output_dir=str(tmp_path / "o"),
                        task="translation", learning_rate="1e-4", max_steps=7, reward_funcs=["bleu"],
                        num_samples=2, report_to="none", eval_num_beams=3)
    script_args, args = parse_args(["--config", config, "--max_steps", "3", "--reward_funcs", "chrf", "--tiny_model",
                                    "bart"], defaults={"task": "summarization", "max_source_length": 99})
    assert args.max_steps == 3 and script_args.reward_funcs == ["chrf"] and script_args.tiny_model == "bart"  # CLI
    assert args.learning_rate == 1e-4 and script_args.eval_num_beams == 3  # YAML ("1e-4" is a YAML string)
    assert args.task == "translation"  # YAML over the recipe's default
    assert args.max_source_length == 99  # the recipe's default where nothing else sets it
    assert args.output_dir == str(tmp_path / "o") and type(args).__name__ == "SeqRLConfig"
    script_args, args = parse_args(["--config", config, "--reward_funcs", "bleu", "chrf", "--reward_weights", "0.3",
                                    "0.7"])
    assert script_args.reward_funcs == ["bleu", "chrf"] and args.reward_weights == [0.3, 0.7]
    assert "reward_funcs" not in args.to_dict()  # training arguments stay plain data
    with pytest.warns(UserWarning, match=r"\['num_samples'\] do not apply"):
        _, args = parse_args(["--config", config, "--algorithm", "scheduled_sampling"])
    assert type(args).__name__ == "ScheduledSamplingConfig"


def test_unknown_yaml_setting_is_named_with_the_closest_name(tmp_path, capsys):
    from hf_seqrl.cli import UsageError, main

    config = write_yaml(tmp_path, tiny_model="t5", train_file="x.txt", learning_rat=0.1)
    with pytest.raises(UsageError, match=r"unknown setting\(s\) 'learning_rat' \(did you mean 'learning_rate'\?\)"):
        parse_args(["--config", config])
    assert main(["train", "--config", config]) == 2  # one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("hf-seqrl train: error: ") and "Traceback" not in err and "learning_rate" in err


def test_abbreviated_and_unknown_flags_are_refused(tmp_path):
    from hf_seqrl.cli import UsageError

    base = ["--tiny_model", "t5", "--train_file", "x.txt", "--output_dir", str(tmp_path)]
    with pytest.raises(UsageError, match=r"unknown flag\(s\) --learning_rat \(did you mean 'learning_rate'\?\)"):
        parse_args(base + ["--learning_rat", "0.1"])  # argparse would have read it as --learning_rate
    with pytest.raises(UsageError, match=r"--num_sample "):
        parse_args(base + ["--num_sample", "2"])


def test_a_flag_of_another_algorithm_is_ignored_as_in_the_yaml(tmp_path):
    # The README's line: an SCST config run as MRT with --baseline, a field MRT does not have.
    with pytest.warns(UserWarning, match=r"the command line: \['baseline'\] do not apply to algorithm='mrt' "
                                         r"\(MRTConfig\); ignored"):
        _, args = parse_args(["--config", TRANSLATION, "--algorithm", "mrt", "--baseline", "none", "--num_samples", "3"])
    assert type(args).__name__ == "MRTConfig" and args.num_samples == 3  # the flags after it still count


def test_script_arguments_errors(tmp_path):
    with pytest.raises(ValueError, match="exactly one of model_name_or_path"):
        parse_args(["--train_file", "x.txt", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="dataset_name .* or train_file"):
        parse_args(["--tiny_model", "t5", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="algorithm='ppo' is not one of .*'mrt'"):
        parse_args(["--tiny_model", "t5", "--train_file", "x", "--algorithm", "ppo", "--output_dir", str(tmp_path)])


def test_every_recipe_config_parses_and_names_its_launch_command():
    for config in sorted(CONFIGS.glob("*.yaml")):
        first = config.read_text().splitlines()[0].split()
        assert first[:4] == ["#", "accelerate", "launch", "--config_file"], config.name
        assert (REPO / first[4]).is_file() and (REPO / first[5]).is_file(), config.name
        assert first[6:] == ["--config", f"recipes/configs/{config.name}"], config.name
        script_args, args = parse_args(["--config", str(config.relative_to(REPO)), "--bf16", "false"])
        assert args.task in first[5]  # the translation recipe for translation configs, etc.
    # The distillation recipes: a student and a teacher of one family and tokenizer, read as a DistillationConfig.
    students = {}
    for name in ("nllb_600m_distill_from_1.3b_wmt16_de_en", "qwen2.5_0.5b_distill_from_7b_wmt16_de_en"):
        script_args, args = parse_args(["--config", f"recipes/configs/{name}.yaml", "--bf16", "false"])
        assert type(args).__name__ == "DistillationConfig" and script_args.algorithm == "distill", name
        students[script_args.model_name_or_path] = (script_args.teacher_model, args.lmbda, args.beta)
    assert students == {"facebook/nllb-200-distilled-600M": ("facebook/nllb-200-1.3B", 0.5, 0.5),
                        "Qwen/Qwen2.5-0.5B-Instruct": ("Qwen/Qwen2.5-7B-Instruct", 1.0, 1.0)}


ACCELERATE_CONFIGS = REPO / "recipes" / "accelerate_configs"
# What a multi-node config sets apart from the one-machine config it extends.
MACHINE_FIELDS = {"num_machines", "num_processes", "machine_rank", "main_process_ip", "main_process_port"}


def test_every_accelerate_config_parses_and_names_its_launch_command():
    """Each accelerate config loads as accelerate reads it and names the command that runs it; a multi-node config is
    its one-machine config over 2 machines (every other field the same) and its command gives the machine's rank."""
    from accelerate.commands.config.config_args import load_config_from_file

    types = {}
    for path in sorted(ACCELERATE_CONFIGS.glob("*.yaml")):
        config = load_config_from_file(str(path))
        types[path.stem] = config.distributed_type.value
        commands = [line[2:].split() for line in path.read_text().splitlines() if line.startswith("# accelerate launch")]
        assert len(commands) == 1, path.name
        command = commands[0]
        assert command[:4] == ["accelerate", "launch", "--config_file", f"recipes/accelerate_configs/{path.name}"]
        script = next(token for token in command if token.endswith(".py"))
        assert (REPO / script).is_file() and command[-2] == "--config" and (REPO / command[-1]).is_file(), path.name
        if config.num_machines > 1:
            assert command[command.index("--machine_rank") + 1] == "0", path.name
            assert config.num_processes % config.num_machines == 0 and config.main_process_ip, path.name
            assert (config.main_process_port, config.rdzv_backend) == (29500, "static"), path.name
    assert types == {"single_gpu": "NO", "multi_gpu": "MULTI_GPU", "deepspeed_zero2": "DEEPSPEED",
                     "deepspeed_zero3": "DEEPSPEED", "fsdp": "FSDP", "multi_node_ddp": "MULTI_GPU",
                     "multi_node_deepspeed_zero3": "DEEPSPEED", "multi_node_fsdp": "FSDP"}
    for multi, single in (("multi_node_ddp", "multi_gpu"), ("multi_node_deepspeed_zero3", "deepspeed_zero3"),
                          ("multi_node_fsdp", "fsdp")):
        many, one = (yaml.safe_load((ACCELERATE_CONFIGS / f"{name}.yaml").read_text()) for name in (multi, single))
        assert {k for k in {*many, *one} if many.get(k) != one.get(k)} == MACHINE_FIELDS - {"machine_rank"}, multi
        assert (many["num_machines"], many["num_processes"]) == (2, 2 * one["num_processes"]), multi
    # DeepSpeed starts each machine's processes with torchrun, as the other configs do
    assert yaml.safe_load((ACCELERATE_CONFIGS / "multi_node_deepspeed_zero3.yaml").read_text())[
        "deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"


def test_the_slurm_script_names_its_command_and_is_valid_bash():
    """recipes/slurm/multinode.sbatch: `sbatch` directives for one task per node, the command that submits it (a
    recipe and its config that exist), a default accelerate config over several machines, and bash that parses
    (tests/distributed/test_multinode.py runs it)."""
    import subprocess

    path = REPO / "recipes" / "slurm" / "multinode.sbatch"
    text = path.read_text()
    commands = [line[2:].split() for line in text.splitlines() if line.startswith("# sbatch ")]
    assert len(commands) == 1
    command = commands[0]
    assert command[:4] == ["sbatch", "--nodes", "2", "recipes/slurm/multinode.sbatch"]
    assert command[4:5] == ["recipes/translation.py"] and command[5] == "--config" and (REPO / command[6]).is_file()
    assert "#SBATCH --ntasks-per-node=1" in text.splitlines()
    default = text.split("ACCELERATE_CONFIG:-", 1)[1].split("}", 1)[0]
    assert yaml.safe_load((REPO / default).read_text())["num_machines"] > 1
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


# ---- data -------------------------------------------------------------------------------------------------------

def test_missing_column_error_lists_the_available_ones(tmp_path):
    script_args, args = parse_args(["--config", SUMMARIZATION, "--output_dir", str(tmp_path), "--source_column",
                                    "article"])
    from transformers import ByT5Tokenizer

    with pytest.raises(ValueError, match=r"has no column 'article' \(the source\); available columns: "
                                         r"\['document', 'summary'\]\. Set --source_column"):
        load_splits(script_args, args, ByT5Tokenizer())
    with pytest.raises(ValueError, match="no column 'summary'"):
        train_main(["--config", TRANSLATION, "--output_dir", str(tmp_path), "--target_column", "summary"])


def test_translation_dict_column_and_multiple_references(tmp_path):
    from transformers import ByT5Tokenizer

    rows = [{"translation": {"de": "ein hund", "en": "a dog"}}, {"translation": {"de": "eine katze", "en": "a cat"}}]
    (tmp_path / "wmt.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / "multi.jsonl").write_text(json.dumps({"src": "x y", "refs": ["one", "two"]}))
    script_args, args = parse_args(["--tiny_model", "t5", "--train_file", str(tmp_path / "wmt.jsonl"), "--test_file",
                                    str(tmp_path / "multi.jsonl"), "--source_lang", "de", "--target_lang", "en",
                                    "--output_dir", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="no column 'de'.*available columns: \\['src', 'refs'\\]"):
        load_splits(script_args, args, ByT5Tokenizer())
    script_args.test_file = None
    splits = load_splits(script_args, args, ByT5Tokenizer())
    assert splits["train"]["references"] == [["a dog"], ["a cat"]] and splits["train"]["sources"] == ["ein hund",
                                                                                                          "eine katze"]
    script_args.target_lang = "fr"
    with pytest.raises(ValueError, match=r"no \['fr'\] entry \(languages: \['de', 'en'\]\)"):
        load_splits(script_args, args, ByT5Tokenizer())


def test_plain_text_pairs(tmp_path):
    path = tmp_path / "pairs.txt"
    path.write_text("ein hund\ta dog\n\neine katze\ta cat\tthe cat\n")
    data = read_text_pairs(str(path))
    assert data["source"] == ["ein hund", "eine katze"] and data["target"] == [["a dog"], ["a cat", "the cat"]]
    path.write_text("no tab here\n")
    with pytest.raises(ValueError, match="line 1: expected 'source<TAB>reference"):
        read_text_pairs(str(path))


def test_empty_sources_and_references_are_dropped():
    from datasets import Dataset

    from hf_seqrl.data import drop_empty_pairs

    data = Dataset.from_dict({"source": ["a", " ", "b", "c"], "target": [["x"], ["y"], ["", " "], ["", "z"]]})
    assert drop_empty_pairs(data).to_dict() == {"source": ["a", "c"], "target": [["x"], ["z"]]}
    data = Dataset.from_dict({"source": ["a", "b"], "target": ["x", ""]})
    assert drop_empty_pairs(data).to_dict() == {"source": ["a"], "target": ["x"]}
