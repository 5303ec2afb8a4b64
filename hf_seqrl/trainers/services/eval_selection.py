"""MBR / QE decoding of a trainer's own evaluation (`generation_selection`, docs/mbr.md): each evaluation batch's
sources decoded into candidates, one picked per source (`hf_seqrl.candidates.selected_ids`), and the picks scored by
`compute_metrics` as a greedy or beam decode would be; `load_best_model_at_end` then keeps the checkpoint that decodes
best the way it will be decoded.

The candidates of an evaluation's `k`-th batch (on each process) are drawn with seed `seed + k`, `seed` being the
selection's (default: the run's `seed`): every evaluation of the same model on the same data draws the same samples.
"""

from __future__ import annotations

from dataclasses import fields

from ...candidates import SelectionDecoding, seeded, selected_ids, with_reward_built


class EvaluationSelection:
    """The MBR / QE decoding of a trainer's evaluations: its `SelectionDecoding` (reward built once) and the number
    of batches the running evaluation has decoded."""

    def __init__(self, decoding: SelectionDecoding):
        self.decoding, self.batches = decoding, 0

    @classmethod
    def of(cls, args, device) -> EvaluationSelection | None:
        """Returns the selection `args.generation_selection` asks for (None without one), its utility or QE reward
        loaded on `device`; a setting `SelectionDecoding` refuses is refused naming the field."""
        spec = getattr(args, "generation_selection", None)
        if not spec:
            return None
        known = {f.name for f in fields(SelectionDecoding)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"generation_selection: unknown key(s) {unknown}; it takes {sorted(known)} "
                             "(the selection keywords of hf_seqrl.evaluation.generate_texts).")
        if (args.generation_num_beams or 1) > 1:
            raise ValueError(f"generation_selection decodes by {spec.get('decode')!r} over its candidates, and "
                             f"generation_num_beams={args.generation_num_beams} asks for beam search: leave "
                             "generation_num_beams unset (the beam's n-best is candidates='beam').")
        try:
            decoding = SelectionDecoding(**{"seed": args.seed, **spec})
        except ValueError as error:
            raise ValueError(f"generation_selection={spec!r}: {error}") from error
        return cls(with_reward_built(decoding, device))

    def start(self) -> None:
        """Called as an evaluation (or prediction) starts: its first batch draws with the selection's seed."""
        self.batches = 0

    def record(self) -> dict:
        """Returns the settings as JSON data (`SelectionDecoding.record`)."""
        return self.decoding.record()

    def predict(self, model, tokenizer, batch: dict, sources, **generate_kwargs):
        """Returns the ids `(B, T)` of each source's pick (`candidates.selected_ids`) of the next evaluation batch.
        `generate_kwargs` are the evaluation's (`max_length`, `max_new_tokens`, `synced_gpus`); beam search among
        them (`num_beams` > 1, as `evaluate(num_beams=...)` passes it) is refused."""
        beams = generate_kwargs.pop("num_beams", None) or 1
        if beams > 1:
            raise ValueError(f"num_beams={beams} with generation_selection={self.record()}: the picks are made "
                             "among the selection's candidates; evaluate without num_beams.")
        if self.decoding.decode == "qe" and sources is None and getattr(model.config, "is_encoder_decoder", False):
            sources = tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)
        if self.decoding.decode == "qe" and sources is None:
            raise ValueError("generation_selection decodes by QE, whose reward reads each source, and this "
                             "evaluation dataset has no 'sources' column: give text columns (they keep one).")
        known = ("max_length", "max_new_tokens", "synced_gpus")
        with seeded(model, (self.decoding.seed or 0) + self.batches):
            ids = selected_ids(model, tokenizer, batch, sources, self.decoding,
                               **{k: v for k, v in generate_kwargs.items() if k in known})
        self.batches += 1
        return ids
