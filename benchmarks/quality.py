#!/usr/bin/env python
"""Quality benchmark on real data: does sequence-level training beat more cross-entropy at equal compute?

    python benchmarks/quality.py --task translation      # Multi30k de->en, Marian-style model from scratch
    python benchmarks/quality.py --task summarization    # SciTLDR-A, BERT2BERT warm-started from MiniLM
    python benchmarks/quality.py --task translation --quick   # smoke run (minutes)

Protocol
1. Checkpoint C: cross-entropy (plain `Seq2SeqTrainer`) until the dev metric plateaus: greedy corpus BLEU
   (translation) or ROUGE-L (summarization) on a fixed dev subset every `eval_every` steps; stop after
   `patience` evaluations without a new best, or at its step cap (`c_max_steps`, `anneal_max_steps`: the rule counts
   steps, never seconds); C = the best weights. C is cached in the
   work directory, so the arms can be rerun alone (`--arms`, `--seeds`).
2. From C, four arms with the same budget of *decoder token positions* (generated plus teacher-forced,
   padding included, counted by a hook on the decoder; encoder work is not counted): (a) more cross-entropy,
   (b) scheduled sampling (linear ε from 1 to `ss_min_ratio` over the first half), (c) SCST with the greedy
   baseline, 1 sample, (d) leave-one-out baseline with 4 samples; with `--arms`, also (e) `scst_clip`: SCST whose
   rollouts each serve `clip_iterations` clipped optimizer steps, (f) `mrt`: minimum risk training over
   `mrt_samples` samples plus the greedy decode, and the input-schedule, MIXER and professor-forcing arms of
   `benchmarks/exposure.py`; the token-level reward arms (`scst_tokens`, `loo4_tokens`: `token_match`); and the
   distillation arms (`kd_word`, `kd_seq`, `distill`, `gkd`, `distill_bleu`) from a teacher trained by step 1's
   protocol at the `teacher_*` sizes. The sequence-level arms mix in cross-entropy on the gold target:
   loss = rl_weight * RL + (1 - rl_weight) * XE, as Edunov et al. (2018) and Paulus et al. (2017) do.
   All arms share the learning rate, batch size and data order.
3. Test corpus BLEU and chrF (translation) or mean best-reference ROUGE-1/2/L F1 (summarization, against
   every reference), greedy and beam 4, and the exposure-bias diagnostics of each arm (`run_diagnostics`).
4. Several seeds per arm; the table reports mean and spread (min..max). The dev metric of every run is
   recorded too: hyper-parameters are chosen on dev, never on test.

Every finished unit (C, each arm x seed) is cached as JSON under the work directory; a rerun skips what is done.
Reads `../shared/data` (see its README); exits with a message when the data is absent. The code is the package
`benchmarks/quality_lib/`, which the other benchmarks import.
"""

from quality_lib import main

if __name__ == "__main__":
    main()
