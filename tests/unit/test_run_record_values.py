"""`hf_seqrl.trainers.services.run_record`: when a run counts as cross-entropy fine-tuning, and what seqrl_run.json records."""

from hf_seqrl.papers import Method
from hf_seqrl.trainers.services.run_record import (CROSS_ENTROPY_ID, changed_training_warning, cross_entropy_reason,
                                          trainer_identity, training_record)


def test_a_run_is_cross_entropy_when_its_warm_up_covers_it_or_its_own_loss_is_off():
    assert cross_entropy_reason("scst", 10, 10, None) == "warmup_xe_steps=10 covers all 10 optimizer steps of the run"
    assert cross_entropy_reason("scst", 10, 4, None) is not None
    assert cross_entropy_reason("scst", 10, 11, None) is None  # one SCST step
    assert cross_entropy_reason("scst", 10, 0, None) is None  # steps unknown (epochs decide, not trained yet)
    assert cross_entropy_reason("scst", 0, 5, "rl_weight=0") == "rl_weight=0"
    assert cross_entropy_reason(CROSS_ENTROPY_ID, 10, 5, None) is None  # plain cross-entropy is its own loss


def test_the_record_of_a_cross_entropy_run_names_its_trainer_and_nothing_else_of_it():
    method = Method("SCST", "scst", "policy gradient", baseline="greedy")
    identity = trainer_identity("SCSTTrainer", "scst", method, "greedy")
    assert training_record(identity, None, "bleu", None, 5, 2) == {**identity, "reward": "bleu", "teacher": None,
                                                                   "steps": 5, "warmup_xe_steps": 2}
    record = training_record(identity, "why", "bleu", "teacher", 2, 2)
    assert (record["trainer"], record["algorithm"], record["method"], record["baseline"], record["reward"],
            record["teacher"], record["cross_entropy_only"]) == ("SCSTTrainer", "xe", "Cross-entropy", None, None,
                                                                 None, "why")
    message = changed_training_warning("MRTTrainer", "Minimum risk training", "out/checkpoint-4", identity,
                                       ["algorithm: 'scst' → 'mrt'"])
    assert message.startswith("MRTTrainer: out/checkpoint-4 was trained by SCSTTrainer (SCST), and this run trains "
                              "with Minimum risk training: algorithm: 'scst' → 'mrt'.")
