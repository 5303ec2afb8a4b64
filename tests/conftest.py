"""pytest set-up: offline environment, one intra-op thread, the shared fixtures (helpers live in `helpers.py`)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from helpers import byt5_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
warnings.filterwarnings("ignore", message=".*pin_memory.*")
# Tiny models gain nothing from intra-op threads, and spinning OpenMP threads collapse when the two cores
# are shared with another process (one forward+backward went from 17 ms to 1 s).
torch.set_num_threads(1)


@pytest.fixture
def tokenizer():
    return byt5_tokenizer()
