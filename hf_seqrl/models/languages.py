"""Language codes of multilingual tokenizers (M2M100, NLLB, mBART, mBART-50), resolved through each tokenizer's own
table: the token a code names, the model's first decoded token set to the one the labels start with, and the
language tokens kept out of the text that rewards, logs and metrics read.

The tables differ: M2M100 names a language `en` and its token `__en__` (`lang_code_to_id`); mBART-50 names both
`en_XX` (`lang_code_to_id`); NLLB and mBART name both `eng_Latn` / `en_XX` (their module's `FAIRSEQ_LANGUAGE_CODES`).
Looking a code up as an ordinary token (`convert_tokens_to_ids`) finds a subword for M2M100's `en` and an unknown
token for `ja`, so every lookup here goes through the table.
"""

from __future__ import annotations

import difflib
import logging
import sys
import weakref

import torch

logger = logging.getLogger(__name__)

_table_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def language_codes(tokenizer) -> dict[str, int]:
    """Returns `{code: token id}` for every language code `tokenizer` defines (empty for a tokenizer without
    language codes): its `lang_code_to_id` where it has one (M2M100, mBART-50), else the codes its module lists
    (`FAIRSEQ_LANGUAGE_CODES`: NLLB, mBART) that are tokens of its vocabulary."""
    cached = _table_cache.get(tokenizer) if _weakable(tokenizer) else None
    if cached is not None and cached[0] == len(tokenizer):
        return cached[1]
    table = getattr(tokenizer, "lang_code_to_id", None)
    if isinstance(table, dict) and table:
        codes = {str(code): int(token) for code, token in table.items()}
    elif hasattr(tokenizer, "src_lang"):
        listed = getattr(sys.modules.get(type(tokenizer).__module__), "FAIRSEQ_LANGUAGE_CODES", None)
        names = list(listed) if isinstance(listed, (list, tuple)) else []
        unknown = getattr(tokenizer, "unk_token_id", None)
        ids = tokenizer.convert_tokens_to_ids(names) if names else []
        codes = {code: token for code, token in zip(names, ids) if token is not None and token != unknown}
    else:
        codes = {}
    if _weakable(tokenizer):
        _table_cache[tokenizer] = (len(tokenizer), codes)
    return codes


def _weakable(tokenizer) -> bool:
    try:
        weakref.ref(tokenizer)
    except TypeError:
        return False
    return True


def code_token_id(tokenizer, code: str, field: str) -> int:
    """Returns the token id of language `code` in `tokenizer`'s table, or raises a ValueError naming `field`, the
    codes the tokenizer defines and the closest ones to `code`."""
    codes = language_codes(tokenizer)
    if code in codes:
        return codes[code]
    name = type(tokenizer).__name__
    if not codes:
        raise ValueError(f"{field}={code!r}: the tokenizer ({name}) has no language codes; drop it (language codes "
                         "are for M2M100, NLLB, mBART and mBART-50 tokenizers).")
    close = [c for c in codes if c == code.strip("_")]  # M2M100's token `__en__` for its code `en`
    close += [c for c in codes if c.lower().startswith(code.lower().strip("_")[:2]) and c not in close][:4]
    close += [c for c in difflib.get_close_matches(code, list(codes), n=3) if c not in close]
    hint = f" Did you mean {', '.join(repr(c) for c in close[:5])}?" if close else ""
    shown = ", ".join(list(codes)[:12])
    raise ValueError(f"{field}={code!r} is not a language code of {name}, which defines {len(codes)} codes "
                     f"({shown}, ...).{hint}")


def target_start_id(tokenizer) -> int | None:
    """Returns the id the tokenizer writes first into a target's labels (a multilingual tokenizer's target language
    token), or None when it writes its plain tokens first. Raises a ValueError when the tokenizer cannot mark a
    target (no `tgt_lang`) or puts the code after the text (NLLB's `legacy_behaviour=True`)."""
    name = type(tokenizer).__name__
    codes = language_codes(tokenizer)
    if not codes:
        return None
    target = getattr(tokenizer, "tgt_lang", None)
    if target is None:
        raise ValueError(f"The tokenizer ({name}) marks targets with a language code, but its tgt_lang is not set: "
                         "pass tgt_lang= to AutoTokenizer.from_pretrained (e.g. 'eng_Latn' for NLLB, 'en' for "
                         "M2M100, 'en_XX' for mBART-50) or --tgt_lang to hf-seqrl.")
    wanted = code_token_id(tokenizer, target, f"{name}.tgt_lang")
    encoded = tokenizer(text_target="a")  # a target alone comes back as its input_ids
    labels = encoded.get("labels", encoded["input_ids"])
    if not labels or labels[0] != wanted:
        raise ValueError(f"The tokenizer ({name}) does not start a target's labels with its tgt_lang {target!r} "
                         f"(token {wanted}; the labels start {labels[:3]}), so no forced first token can match them: "
                         "load it with legacy_behaviour=False.")
    return wanted


def set_language_codes(model, tokenizer, src_lang: str | None, tgt_lang: str | None,
                       owner: str = "ScriptArguments") -> None:
    """Sets a multilingual tokenizer's `src_lang` / `tgt_lang` (it marks sources and targets with their codes) and
    starts the model's decode with the target's language token (`forced_bos_token_id` of its generation config,
    saved with the model), as M2M100, NLLB and mBART translate. Refuses a code the tokenizer's table does not
    define (naming the ones it does), a tokenizer without language codes, a decoder-only model and a generation
    config that forces another first token (errors name `owner`'s fields)."""
    if src_lang is None and tgt_lang is None:
        return
    if getattr(model.config, "is_encoder_decoder", False) is False:
        raise ValueError(f"{owner}.src_lang / tgt_lang: language codes apply to multilingual encoder-decoder "
                         f"models (NLLB, mBART, M2M100); {type(model).__name__} is decoder-only: put the languages "
                         "in prompt_template instead.")
    ids = {field_name: code_token_id(tokenizer, code, f"{owner}.{field_name}")
           for field_name, code in (("src_lang", src_lang), ("tgt_lang", tgt_lang)) if code is not None}
    if src_lang is not None:
        tokenizer.src_lang = src_lang
    if tgt_lang is not None:
        tokenizer.tgt_lang = tgt_lang
        forced, wanted = model.generation_config.forced_bos_token_id, ids["tgt_lang"]
        if forced is not None and forced != wanted:
            raise ValueError(f"{owner}.tgt_lang={tgt_lang!r} (token {wanted}), but the model's generation "
                             f"config forces token {forced} first: drop tgt_lang or set "
                             "generation_config.forced_bos_token_id to it.")
        model.generation_config.forced_bos_token_id = wanted


def align_target_language(model, tokenizer, trainer: str) -> int | None:
    """Makes an encoder-decoder model's decode start with the language token its labels start with: sets the
    generation config's `forced_bos_token_id` to the tokenizer's `tgt_lang` token when it forces none (logged),
    and raises a ValueError naming both tokens when it forces another. Returns the token id (None for a tokenizer
    without language codes or a decoder-only model)."""
    if not getattr(model.config, "is_encoder_decoder", False) or not language_codes(tokenizer):
        return None
    try:
        wanted = target_start_id(tokenizer)
    except ValueError as error:
        raise ValueError(f"{trainer}: {error}") from None
    config = model.generation_config
    forced = config.forced_bos_token_id
    target = tokenizer.tgt_lang
    if forced is None:
        config.forced_bos_token_id = wanted
        logger.info("%s: decodes start with %r (token %d), the tgt_lang the tokenizer starts every target with; "
                    "saved as the generation config's forced_bos_token_id.", trainer, target, wanted)
    elif forced != wanted:
        forced_token = tokenizer.convert_ids_to_tokens(forced)
        raise ValueError(
            f"{trainer}: the tokenizer's tgt_lang {target!r} starts every target with token {wanted}, but the model's "
            f"generation config forces token {forced} ({forced_token!r}) first, so every sample would start in "
            f"another language than its labels: set tokenizer.tgt_lang to that language, or "
            f"model.generation_config.forced_bos_token_id = {wanted}.")
    return wanted


def language_token_ids(tokenizer) -> frozenset[int]:
    """Returns the ids of the language tokens that `decode(skip_special_tokens=True)` keeps (M2M100's `__en__` on
    transformers 5 is not marked special): the ids `text_ids` removes."""
    codes = language_codes(tokenizer)
    if not codes:
        return frozenset()
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    return frozenset(token for token in codes.values() if token not in special)


def text_ids(tokenizer, ids):
    """Returns `ids` (a `(N, T)` tensor or a list of id lists) with every language token replaced by the pad id, so
    that decoding them skipping special tokens reads the text alone."""
    drop = language_token_ids(tokenizer)
    if not drop:
        return ids
    pad = tokenizer.pad_token_id
    if isinstance(ids, torch.Tensor):
        mask = torch.isin(ids, torch.tensor(sorted(drop), device=ids.device))
        return ids.masked_fill(mask, pad)
    return [[pad if int(i) in drop else i for i in row] for row in ids]


def decode_texts(tokenizer, ids) -> list[str]:
    """Returns the text of each row of `ids` (`(N, T)` tensor or lists of ids): special and language tokens
    skipped, as every reward, sample log and metric reads it."""
    return tokenizer.batch_decode(text_ids(tokenizer, ids), skip_special_tokens=True)
