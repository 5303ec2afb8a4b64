"""Host syncs per decoded position through the trainers, counted on CPU by `benchmarks/counting.SyncCounter` (the ops
that make a host wait for a GPU): at most one per position in all, at most 0.25 in hf-seqrl's own code, for SCST,
leave-one-out and MRT on both families, with a banned token set (as opus-mt models ban pad) and EOS never chosen, so
that every row runs to the limit. The difference between two limits is what each further position costs."""

import sys
import tempfile

import pytest
import torch
from datasets import Dataset

from helpers import REPO, byt5_tokenizer, tiny_causal_model, tiny_model
from hf_seqrl import MRTConfig, MRTTrainer, SCSTTrainer, SeqRLConfig

sys.path.insert(0, str(REPO / "benchmarks"))
from counting import SyncCounter  # noqa: E402

EOS, SOURCES = 1, ["abc def", "hello there", "world peace", "seq level"]
ARMS = {"scst": (SCSTTrainer, SeqRLConfig, {}), "loo4": (SCSTTrainer, SeqRLConfig, dict(baseline="mean", num_samples=4)),
        "mrt": (MRTTrainer, MRTConfig, dict(num_samples=3))}


def syncs(family: str, arm: str, max_new_tokens: int, steps: int = 2) -> SyncCounter:
    model = tiny_model("t5", dropout=0.1) if family == "seq2seq" else tiny_causal_model()
    model.generation_config.bad_words_ids = [[5]]
    model.get_output_embeddings().register_forward_hook(lambda module, inputs, out: out.index_add(
        -1, torch.tensor([EOS]), torch.full((*out.shape[:-1], 1), -1e4, dtype=out.dtype)))
    columns = ("source", "target") if family == "seq2seq" else ("prompt", "completion")
    data = Dataset.from_dict({columns[0]: SOURCES, columns[1]: [s[::-1] for s in SOURCES]})
    trainer_class, config_class, settings = ARMS[arm]
    args = config_class(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=steps,
                        report_to="none", max_new_tokens=max_new_tokens, save_strategy="no", disable_tqdm=True,
                        logging_steps=1000, use_cpu=True, seed=0, **settings)
    trainer = trainer_class(model=model, args=args, reward_funcs="chrf", processing_class=byt5_tokenizer(),
                            train_dataset=data)
    counter, training_step = SyncCounter(), trainer.training_step

    def counted(*a, **k):
        with counter.counting():
            return training_step(*a, **k)

    trainer.training_step = counted
    with counter:
        trainer.train()
    return counter


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
@pytest.mark.parametrize("arm", list(ARMS))
def test_at_most_one_host_sync_per_decoded_position(family, arm):
    short, long = syncs(family, arm, 4), syncs(family, arm, 12)
    positions = 8 * 2  # 8 more positions in each of 2 steps
    total = (long.total - short.total) / positions
    ours = (long.by_site["hf_seqrl"] - short.by_site["hf_seqrl"]) / positions
    where = {frame: long.by_frame[frame] - short.by_frame[frame] for frame in long.by_frame}
    assert total <= 1.0 and ours <= 0.25, where
