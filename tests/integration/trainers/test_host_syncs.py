"""Host syncs per decoded position through the trainers, counted on CPU by `benchmarks/counting.SyncCounter` (the ops
that make a host wait for a GPU): at most one per position in all, at most 0.25 in hf-seqrl's own code, for SCST,
leave-one-out and MRT on both families, with a banned token set (as opus-mt models ban pad) and EOS never chosen, so
that every row runs to the limit (`benchmarks/host_syncs.count`). The difference between two limits is what each
further position costs."""

import sys

import pytest

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from host_syncs import ARMS, count  # noqa: E402


# Two pairs in the default run, the other four in the slow tier.
PAIRS = [(family, arm) if (family, arm) in (("seq2seq", "scst"), ("causal", "loo4"))
         else pytest.param(family, arm, marks=pytest.mark.slow) for family in ("seq2seq", "causal") for arm in ARMS]


@pytest.mark.parametrize("family,arm", PAIRS)
def test_at_most_one_host_sync_per_decoded_position(family, arm):
    short, long = count(family, arm, 4, "cpu", steps=2), count(family, arm, 12, "cpu", steps=2)
    positions = 8 * 2  # 8 more positions in each of 2 steps
    total = (long.total - short.total) / positions
    ours = (long.by_site["hf_seqrl"] - short.by_site["hf_seqrl"]) / positions
    where = {frame: long.by_frame[frame] - short.by_frame[frame] for frame in long.by_frame}
    assert total <= 1.0 and ours <= 0.25, where
