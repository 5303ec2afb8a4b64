"""Exposure-bias diagnostics for encoder-decoder and decoder-only models: a JSON report and a PNG plot.

Four measurements on `sources` and `references`; metrics use all references. Token positions count the
tokenized gold target, EOS included, without the decoder start token. A decoder-only model reads each source as its
prompt (`hf_seqrl.data.prompt_token_ids`) and writes the target as its completion: the prefix at position `k` is the
prompt plus the first `k` completion tokens, and the model family (`hf_seqrl.models`) runs every pass.

Gold target. The teacher-forced measures (1-4 below) score one reference per source, the *gold*: the
reference closest to the model's own greedy output under the chosen sentence metric
(`hf_seqrl.rewards.get_reward(metric)`, each reference scored alone; ties go to the earlier reference).
With one reference per source the gold is that reference. Several references are often several valid
renderings (dialects, paraphrases, TL;DRs): scoring the teacher-forced pass against the first one would
call a model wrong for committing to another, while its free-running metric, against every reference,
calls it right. The report records the rule in `config["gold"]`, the chosen index per example in
`gold_index` and the number of rows whose gold is not their first reference in `gap["gold_not_first"]`.

1. Gap: mean per-token NLL and accuracy of the gold target under gold prefixes (teacher forcing), next to
   the corpus metric and length of greedy free-running outputs.
2. Horizon: at each position `k`, next-token accuracy and NLL of the gold token `k` when the decoder prefix
   is the gold `gold[:k]` (`tf_*`) or the model's own greedy output `greedy[:k]` (`free_*`). Both curves
   average the same examples: those whose gold has a token at `k` and whose greedy output has not ended
   (emitted EOS) before `k`. At `k = 0` both prefixes are empty, so the curves coincide.
3. Recovery: at position `j`, the decoder is forced through `gold[:j]` plus the model's most likely token
   other than `gold[j]` (EOS, pad and special tokens excluded) and then decodes greedily. With
   `w = min(recovery_window, len(gold) - j - 1)`, the continuation `c` (tokens after the injected one, up to
   its EOS) *rejoins* the reference when some window `c[d:d+w]` equals some `gold[i:i+w]` with `i >= j`
   (substitutions, insertions and skips all count); `d`, the number of tokens before that window, is how fast.
   Only content positions (before the gold EOS, not special tokens) are injected. The metric drop is the mean
   sentence metric of clean greedy decoding from `gold[:j]` minus that of decoding from the corrupted prefix.
4. Source reliance: the teacher-forced NLL of each gold target under *another* source of its batch (sources
   rotated by one) minus its NLL under its own source (`source_nll_gap`, nats per token), and the share of
   distinct greedy outputs (`distinct_rate`). A gap near 0 and a low distinct rate mean the model writes one
   generic output whatever the source: its metric differences are then template switches, not translation or
   summarization. Batches of one source have no other source and add nothing to the gap.

Metric values are on 0-100, as `hf_seqrl.evaluation.corpus_scores` (and so `hf-seqrl evaluate` and the trainers'
`eval_*` metrics) gives them; the recovery's sentence metrics are `hf_seqrl.rewards` values × 100. Each batch decodes
at most `decode_budget` new tokens; the report counts the greedy outputs that never wrote EOS (`gap.never_stopped`).

Modules: `measure` (`run_diagnostics`), `report` (files and text table), `plot` (matplotlib, imported only
when a plot is drawn), `callback` (`DiagnosticsCallback`). `hf-seqrl diagnose` is `hf_seqrl.cli.diagnose`.
"""

from .callback import DiagnosticsCallback
from .measure import METRICS, run_diagnostics
from .plot import plot_diagnostics
from .report import format_summary, write_report

__all__ = ["DiagnosticsCallback", "METRICS", "format_summary", "plot_diagnostics", "run_diagnostics", "write_report"]
