"""MBR fine-tuning, offline, end to end on tiny models: the model's own MBR picks written by `hf-seqrl distill-data
--decode mbr` (self-training), then trained on by cross-entropy (`hf-seqrl train --algorithm xe --target_column
teacher_target`, or `CrossEntropyTrainer` on prompt / completion rows). The utility picks a candidate other than the
first sample, and the trained step's loss and update equal cross-entropy on the picks computed by hand from the same
model: the test fails if the selection were ignored."""

import json

import pytest
import torch

from helpers import by_hand_mbr, byt5_tokenizer, length_agreement, make_config, tiny_causal_model, tiny_model
from hf_seqrl.candidates import sample_candidates
from hf_seqrl.data import completion_token_ids, prompt_token_ids

SOURCES = ["abc", "dcba", "bad", "cab ab", "dab"]
SAMPLING = dict(epsilon_cutoff=0.002, seed=4, batch_size=8, max_new_tokens=6, progress=False)
LR = 0.5


def cross_entropy_by_hand(model, tokenizer, sources, targets) -> torch.Tensor:
    """Returns the mean over all target tokens (EOS included) of -log p(token | source, earlier tokens), each pair
    run alone through the model (no padding), with grad."""
    total, count = 0.0, 0
    for source, target in zip(sources, targets):
        if model.config.is_encoder_decoder:
            labels = torch.tensor([tokenizer(text_target=target)["input_ids"]])
            decoder_inputs = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)  # start token 0
            logits = model(input_ids=torch.tensor([tokenizer(source)["input_ids"]]),
                           decoder_input_ids=decoder_inputs).logits[0]
            labels = labels[0]
        else:
            prompt, labels = prompt_token_ids(source, tokenizer), torch.tensor(completion_token_ids(target, tokenizer))
            logits = model(input_ids=torch.tensor([prompt + labels.tolist()])).logits[0, len(prompt) - 1:-1]
        total = total - logits.log_softmax(-1).gather(1, labels[:, None]).sum()
        count += len(labels)
    return total / count


def expected_update(model, tokenizer, targets) -> tuple[float, dict[str, torch.Tensor]]:
    """Returns the loss of one plain SGD step of rate `LR` on `targets` and the parameters after it, by hand."""
    model.eval().zero_grad()
    loss = cross_entropy_by_hand(model, tokenizer, SOURCES, targets)
    loss.backward()
    return loss.item(), {name: (p - LR * p.grad).detach() for name, p in model.named_parameters()}


def mbr_picks_and_first_samples(model, tokenizer):
    """Returns the MBR picks under `length_agreement` (the median length) among 5 samples per source, and the first
    samples; asserts the selection changes some targets."""
    candidates = sample_candidates(model, tokenizer, SOURCES, 5, **SAMPLING)
    picks, firsts = by_hand_mbr(candidates, length_agreement), [cands[0] for cands in candidates]
    assert picks != firsts and all(picks)
    return picks, firsts


SGD_STEP = ["--optim", "sgd", "--learning_rate", str(LR), "--lr_scheduler_type", "constant", "--max_grad_norm", "0",
            "--weight_decay", "0", "--max_steps", "1", "--per_device_train_batch_size", "8", "--logging_steps", "1",
            "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true"]


def test_mbr_self_training_through_the_cli_trains_cross_entropy_on_the_picks(tmp_path):
    """`distill-data --decode mbr` on the model itself, then `train --algorithm xe --target_column teacher_target
    --eval_target_column target`: the rows' targets are the MBR picks, and the step's logged loss and the weights it
    writes are cross-entropy's on the picks (plain SGD: weights - LR * gradient)."""
    from transformers import AutoModelForSeq2SeqLM

    from hf_seqrl.cli import main

    tok, model = byt5_tokenizer(), tiny_model("t5", seed=3)
    folder, data, output = tmp_path / "model", tmp_path / "data.jsonl", tmp_path / "mbr.jsonl"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    data.write_text("".join(json.dumps({"source": s, "target": s[::-1]}) + "\n" for s in SOURCES))
    assert main(["distill-data", "--teacher", str(folder), "--data", str(data), "--output", str(output),
                 "--decode", "mbr", "--num_candidates", "5", "--utility", "helpers:length_agreement",
                 "--epsilon_cutoff", "0.002", "--seed", "4", "--max_new_tokens", "6", "--batch_size", "8",
                 "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    picks, firsts = mbr_picks_and_first_samples(model, tok)
    assert [row["teacher_target"] for row in rows] == picks
    assert [row["target"] for row in rows] == [s[::-1] for s in SOURCES]  # the gold kept for evaluation

    out = tmp_path / "trained"
    assert main(["train", "--algorithm", "xe", "--model_name_or_path", str(folder), "--train_file", str(output),
                 "--target_column", "teacher_target", "--validation_file", str(output), "--eval_target_column",
                 "target", "--eval_strategy", "no", "--output_dir", str(out), *SGD_STEP]) == 0
    logged = json.loads((out / "trainer_state.json").read_text())["log_history"][0]["loss"]
    loss, after = expected_update(model, tok, picks)
    assert logged == pytest.approx(loss, rel=1e-4)
    assert logged != pytest.approx(cross_entropy_by_hand(model, tok, SOURCES, firsts).item(), rel=1e-3)
    trained = dict(AutoModelForSeq2SeqLM.from_pretrained(out).named_parameters())
    for name, value in after.items():
        torch.testing.assert_close(trained[name].detach(), value, rtol=1e-4, atol=1e-6, msg=name)


def test_mbr_self_training_of_a_decoder_only_model_on_prompt_completion_rows(tmp_path):
    """Decoder-only: `write_teacher_outputs(decode="mbr")` on a prompt column, then `CrossEntropyTrainer` on prompt /
    completion rows whose completion is the pick: the step's update is cross-entropy's on the picks."""
    from datasets import Dataset

    from hf_seqrl import CrossEntropyTrainer, SeqRLBaseConfig
    from hf_seqrl.evaluation import write_teacher_outputs

    tok, model = byt5_tokenizer(), tiny_causal_model("llama", seed=1)
    output = tmp_path / "mbr.jsonl"
    write_teacher_outputs(model, tok, [{"prompt": s} for s in SOURCES], "prompt", str(output), num_beams=1,
                          decode="mbr", num_candidates=5, utility=length_agreement, chunk=8,
                          **{k: v for k, v in SAMPLING.items() if k != "progress"}, progress=False)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    picks, firsts = mbr_picks_and_first_samples(model, tok)
    assert [row["teacher_target"] for row in rows] == picks

    loss, after = expected_update(model, tok, picks)
    assert loss != pytest.approx(cross_entropy_by_hand(model, tok, SOURCES, firsts).item(), rel=1e-3)
    data = Dataset.from_list([{"prompt": row["prompt"], "completion": row["teacher_target"]} for row in rows])
    args = make_config(SeqRLBaseConfig, tmp_path, optim="sgd", learning_rate=LR, max_grad_norm=0.0, weight_decay=0.0,
                       max_steps=1, per_device_train_batch_size=8)
    trainer = CrossEntropyTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(loss, rel=1e-4)
    for name, value in model.named_parameters():
        torch.testing.assert_close(value.detach(), after[name], rtol=1e-4, atol=1e-6, msg=name)
