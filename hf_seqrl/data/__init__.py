"""Datasets → tokenized features plus raw references; a collator that keeps the text columns.

By job: `checks` (the row and column checks, `normalize_references`, `has_text`), `collator`
(`SeqRLDataCollator`), `files` (text pairs from local files or the Hub, for the CLI) and `tokenization` (both model
families' features). Every name is importable from `hf_seqrl.data`.
"""

from .checks import check_causal_rows, check_dataset_columns, check_rows, has_text, normalize_references
from .collator import TEXT_COLUMNS, SeqRLDataCollator
from .files import FILE_FORMATS, check_pairs, drop_empty_pairs, invalid_pairs, load_pairs, load_text_files, read_text_pairs, select_pair_columns
from .tokenization import (SOURCE_COLUMNS, TARGET_COLUMNS, completion_token_ids, prompt_token_ids, render_prompt,
                           source_text, strip_start_token, tokenize_for, tokenize_pairs, tokenize_prompt_completion,
                           tokenize_source_rows, tokenize_sources, tokenize_targets, tokenize_text_dataset)

__all__ = [
    "FILE_FORMATS", "SOURCE_COLUMNS", "TARGET_COLUMNS", "TEXT_COLUMNS", "SeqRLDataCollator", "check_causal_rows",
    "check_dataset_columns", "check_pairs", "check_rows", "completion_token_ids", "drop_empty_pairs", "has_text",
    "invalid_pairs", "load_pairs",
    "load_text_files", "normalize_references", "prompt_token_ids", "read_text_pairs", "render_prompt",
    "select_pair_columns", "source_text", "strip_start_token", "tokenize_for", "tokenize_pairs",
    "tokenize_prompt_completion", "tokenize_source_rows", "tokenize_sources", "tokenize_targets",
    "tokenize_text_dataset",
]
