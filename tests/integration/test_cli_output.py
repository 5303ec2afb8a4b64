"""What the CLI and the trainers tell a person: the closing block of `hf-seqrl train` (where the model, card and
settings went, what to run next), the step a resumed run starts from, and no transformers warning about lengths the
project sets on purpose."""

import logging

from helpers import REPO, byt5_tokenizer, make_config, tiny_model, toy_dataset, toy_pairs
from hf_seqrl import SCSTTrainer, SeqRLConfig

TRANSLATION = str(REPO / "recipes" / "configs" / "tiny_offline_translation.yaml")


def test_train_ends_with_where_things_went_and_what_to_run_next(tmp_path, monkeypatch, capsys):
    from hf_seqrl.cli import main

    monkeypatch.chdir(REPO)
    out = tmp_path / "run"
    assert main(["train", "--config", TRANSLATION, "--max_steps", "2", "--warmup_xe_steps", "1", "--eval_strategy",
                 "no", "--max_eval_samples", "2", "--max_test_samples", "2", "--output_dir", str(out)]) == 0
    printed = capsys.readouterr().out
    block = printed[printed.index("saved the scst model"):]
    assert f"model     {out}/model.safetensors" in block and f"card      {out}/README.md" in block
    assert f"settings  {out}/seqrl_run.json" in block
    assert f"hf-seqrl evaluate --model {out} --data recipes/data/toy_de_en.test.txt" in block


def test_a_resumed_run_says_from_which_step(tmp_path, caplog):
    tokenizer = byt5_tokenizer()
    data = toy_dataset(tokenizer, *toy_pairs(8, seed=4))

    def trainer(steps):
        args = make_config(SeqRLConfig, tmp_path, max_steps=steps, save_strategy="steps", save_steps=2)
        return SCSTTrainer(model=tiny_model("t5"), args=args, reward_funcs="chrf", processing_class=tokenizer,
                           train_dataset=data)

    trainer(2).train()
    with caplog.at_level(logging.WARNING, logger="hf_seqrl"):
        trainer(3).train(resume_from_checkpoint=True)
    assert f"SCSTTrainer: resumed from step 2 ({tmp_path / 'out' / 'checkpoint-2'})" in caplog.text


def test_generate_says_nothing_of_lengths_the_project_sets_on_purpose(caplog):
    from transformers import GenerationConfig

    from hf_seqrl.models import family_for

    model, tokenizer = tiny_model("marian"), byt5_tokenizer()
    model.generation_config.max_length = 512  # opus-mt's checkpoints ship this
    batch = dict(tokenizer(["abc"], return_tensors="pt"))
    config = GenerationConfig(max_length=512, max_new_tokens=3, decoder_start_token_id=0, pad_token_id=0,
                              eos_token_id=1)
    with caplog.at_level(logging.WARNING):
        model.generate(**batch, generation_config=config)
        assert "seem to have been set" in caplog.text  # transformers' own warning, at every call
        caplog.clear()
        family_for(model).generate(model, batch, generation_config=config)
        family_for(model).continue_from(model, batch, None, config)
    assert "seem to have been set" not in caplog.text
