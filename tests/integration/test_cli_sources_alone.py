"""`hf-seqrl train` on a JSON-lines file of sources alone: a run that reads no target trains from it; one that does is
refused, naming the setting."""

import json

from hf_seqrl.cli import main


def test_train_takes_a_file_of_sources_alone_and_names_what_reads_targets(tmp_path, capsys):
    sources = ["abca", "cdd", "bad", "dcba", "ab", "cab", "dd", "acb"]
    (tmp_path / "mono.jsonl").write_text("".join(json.dumps({"source": s}) + "\n" for s in sources))
    common = ["train", "--tiny_model", "t5", "--tiny_d_model", "32", "--train_file", str(tmp_path / "mono.jsonl"),
              "--validation_file", "", "--test_file", "", "--max_steps", "2", "--num_samples", "2",
              "--warmup_xe_steps", "0", "--output_dir", str(tmp_path / "out"), "--report_to", "none",
              "--save_strategy", "no", "--eval_strategy", "no", "--max_new_tokens", "6",
              "--dataloader_pin_memory", "false"]
    assert main([*common, "--reward_funcs", "helpers:source_overlap_reward"]) == 0
    training = json.loads((tmp_path / "out" / "seqrl_run.json").read_text())["training"]
    assert training["reward"] == "helpers:source_overlap_reward" and training["steps"] == 2
    capsys.readouterr()
    assert main([*common, "--reward_funcs", "bleu"]) == 2  # a reward against references: refused, named
    assert "train_dataset has sources and no targets" in capsys.readouterr().err
    assert main([*common, "--reward_funcs", "helpers:source_overlap_reward", "--rl_weight", "0.5"]) == 2
    assert "rl_weight=0.5 mixes in cross-entropy" in capsys.readouterr().err
