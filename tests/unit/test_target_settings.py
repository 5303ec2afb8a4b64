"""What reads the gold targets: `rewards.reference_rewards` (which rewards score against references) and
`trainers.services.references` (which settings of a run read targets, so that a dataset of sources alone is refused)."""

from hf_seqrl import (CrossEntropyTrainer, DistillationConfig, DistillationTrainer, MixerConfig, MixerTrainer,
                      MRTConfig, MRTTrainer, SCSTTrainer, SeqRLBaseConfig, SeqRLConfig)
from hf_seqrl.rewards import (EvaluateReward, TeacherLikelihoodReward, WeightedReward, guard, reference_rewards,
                              target_language_reward)
from hf_seqrl.trainers.services.references import evaluation_target_settings, target_settings


def qe(predictions, references, sources, **columns):
    return [1.0] * len(predictions)


def reads_references(predictions, references, sources=None, **columns):
    return [float(bool(refs)) for refs in references]


reads_references.needs_references = True


def test_built_in_metrics_need_references_and_guards_and_callables_do_not():
    assert reference_rewards("bleu") == ["bleu"]
    assert reference_rewards(["chrf", "repetition", "source_copy", "length_ratio", qe]) == ["chrf"]
    assert reference_rewards(["rouge1", "rougeLsum", "token_match"]) == ["rouge1", "rougeLsum", "token_match"]
    assert reference_rewards(qe) == [] and reference_rewards(reads_references) == ["reads_references"]
    assert reference_rewards(WeightedReward(["bleu", qe])) == ["bleu_reward"]
    assert reference_rewards(guard(qe, target_language_reward("en"), "source_copy")) == []
    assert reference_rewards(guard("chrf", "repetition")) == ["chrf_reward"]
    assert TeacherLikelihoodReward.needs_references is False and EvaluateReward.needs_references is True


def config(cls, **kwargs):
    return cls(output_dir="unused", report_to=[], **kwargs)


def test_only_the_settings_that_read_targets_are_named():
    assert target_settings(SCSTTrainer, config(SeqRLConfig), qe) == []
    assert target_settings(MRTTrainer, config(MRTConfig, num_samples=2), qe) == []
    assert target_settings(DistillationTrainer, config(DistillationConfig), None) == []
    assert target_settings(DistillationTrainer, config(DistillationConfig, lmbda=0.5, seq_kd=True), None) == []
    found = target_settings(SCSTTrainer, config(SeqRLConfig, rl_weight=0.5, warmup_xe_steps=3), "bleu")
    assert [reason.split(" ")[0] for reason in found] == ["SeqRLConfig.warmup_xe_steps=3", "SeqRLConfig.rl_weight=0.5",
                                                          "reward_funcs"]
    assert target_settings(MRTTrainer, config(MRTConfig, num_samples=2, mrt_include_reference=True), qe)[0].startswith(
        "MRTConfig.mrt_include_reference=True")
    assert target_settings(DistillationTrainer, config(DistillationConfig, lmbda=0.0), None)[0].startswith(
        "DistillationConfig.lmbda=0.0 trains the off-policy steps on the gold targets")
    # A trainer that reads targets whatever its settings names itself (and no rl_weight beside).
    assert target_settings(MixerTrainer, config(MixerConfig, rl_weight=0.5), qe) == [
        "MixerTrainer samples continuations of the gold prefixes"]
    assert target_settings(CrossEntropyTrainer, config(SeqRLBaseConfig)) == [
        "CrossEntropyTrainer trains on the gold targets by teacher forcing"]


def test_an_evaluation_split_of_sources_alone_is_refused_only_for_what_reads_its_targets():
    assert evaluation_target_settings(config(SeqRLConfig), None, "bleu") == []  # no generation: nothing scores it
    assert evaluation_target_settings(config(SeqRLConfig, predict_with_generate=True), None, qe) == []
    found = evaluation_target_settings(config(SeqRLConfig, predict_with_generate=True), lambda p: {}, "bleu")
    assert found[0].startswith("compute_metrics") and found[1].startswith("reward_funcs ['bleu'] scores the "
                                                                           "evaluation outputs")
    found = evaluation_target_settings(config(SeqRLConfig, eval_strategy="steps", load_best_model_at_end=True,
                                              save_strategy="steps"))
    assert found == [found[0]] and "metric_for_best_model='loss' needs eval_loss" in found[0]
