"""`hf-seqrl` help texts: each subcommand names itself, both model families and the scales of what it reports."""

import sys

import pytest

from hf_seqrl.cli import main


def test_train_help_names_the_subcommand(capsys):
    program = sys.argv[0]
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert capsys.readouterr().out.startswith("usage: hf-seqrl train ")
    assert sys.argv[0] == program  # the recipes' parser keeps naming itself after its script


@pytest.mark.parametrize("command", ["evaluate", "diagnose"])
def test_model_commands_name_both_families(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "encoder-decoder" in text and "decoder-only" in text and "seq2seq checkpoint" not in text
    assert "0-100" in text


def test_top_level_help_states_both_scales(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "encoder-decoder and decoder-only" in text
    # rewards keep their [0, 1] scale, corpus metrics are 0-100 in training, evaluate and diagnose alike
    assert "rl/* rewards on the rewards' scale ([0, 1] for the built-ins)" in text
    assert "corpus metrics (eval_bleu, eval_rougeL, ...) on 0-100" in text
