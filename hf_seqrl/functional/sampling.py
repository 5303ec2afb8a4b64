"""Sampling from next-token logits by inverse CDF, one uniform per row, and where the uniforms come from. Imports
torch only.

`generate(do_sample=True)` warps the logits (temperature, then top-k, then top-p), takes their softmax and calls
`torch.multinomial`, which draws an exponential variate per vocabulary entry. Here the same warped distribution is
sampled from one uniform `u` per row: the chosen token is the first whose cumulative probability reaches `u`.
Same distribution, `V` times fewer random numbers, and a draw that is a plain function of `u` (testable by hand).

The uniforms come either from the global RNG (`draw_uniforms`) or from a counter-based hash of a key per row and the
step (`keyed_uniforms`): a row's draws then depend on its key alone, not on which other rows share its decode, so
a decode of several micro-batches at once samples what the micro-batches sample one by one.

Shapes: `N` rows (sequences being decoded), `V` vocabulary size.
"""

from __future__ import annotations

import torch


def warp_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                epsilon_cutoff: float = 0.0) -> torch.Tensor:
    """Returns the logits `generate` samples from: divided by `temperature`, then `-inf` outside the top-k, then
    outside the top-p nucleus, then on the tokens whose probability is below `epsilon_cutoff` (the operations of
    transformers' Temperature/TopK/TopP/Epsilon warpers, in their order).

    Args:
        logits (`torch.Tensor` of shape `(N, V)`): next-token logits (float32 for the same rounding as `generate`).
        temperature (`float`): 1.0 leaves the logits unchanged.
        top_k (`int`): keep the tokens whose logit is at least the k-th largest (ties kept); 0 turns it off.
        top_p (`float`): keep the smallest set of most likely tokens whose probability reaches `top_p`
            (at least one token); 1.0 turns it off.
        epsilon_cutoff (`float`): keep the tokens whose probability (after the warps above) is at least this, and
            the most likely token always (epsilon sampling, Hewitt et al., 2022); 0.0 turns it off.
    """
    if temperature is not None and temperature != 1.0:
        logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]))[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1 - top_p)
        drop_sorted[..., -1:] = False
        logits = logits.masked_fill(drop_sorted.scatter(1, order, drop_sorted), float("-inf"))
    if epsilon_cutoff:
        below = logits.softmax(dim=-1) < epsilon_cutoff
        below &= logits < logits.max(dim=-1, keepdim=True).values  # the most likely token stays
        logits = logits.masked_fill(below, float("-inf"))
    return logits


def inverse_cdf_sample(logits: torch.Tensor, uniforms: torch.Tensor, block_size: int = 256) -> torch.Tensor:
    """Returns, for each row, the first token whose cumulative probability under `softmax(logits)` is `>= u`.

    With `u` uniform on (0, 1] the token is distributed as `softmax(logits)`; a token of probability 0 (logit
    `-inf`) is never chosen, since its cumulative probability equals its predecessor's.

    The search runs in two levels: a float64 running sum over the float32 sums of blocks of `block_size`
    probabilities picks the block, then a float64 running sum inside that block picks the token. A float32
    running sum over the whole vocabulary would round tail tokens away (a probability of 1e-9 added to a
    cumulative 0.5 is lost, so that token is never drawn); a float64 one over the whole vocabulary needs a float64
    copy of it, which costs more than the softmax. Here a block's mass is off by float32 rounding (relative
    ~1e-7) and no token's probability is lost.

    Args:
        logits (`torch.Tensor` of shape `(N, V)`): float logits, `-inf` allowed (not a whole row of them).
        uniforms (`torch.Tensor` of shape `(N,)`): values in (0, 1].
        block_size (`int`): tokens per block of the first level.

    Returns: `torch.LongTensor` of shape `(N,)`.
    """
    rows, vocab = logits.shape
    block_size = min(block_size, vocab)
    # The softmax `generate` samples from (one fused kernel, faster than exp and sums apart); its float32
    # probabilities keep tail tokens down to ~1e-38.
    weights = torch.softmax(logits.float(), dim=-1)
    full = vocab // block_size * block_size
    block_sums = weights[:, :full].reshape(rows, -1, block_size).sum(dim=-1)
    if full < vocab:
        block_sums = torch.cat([block_sums, weights[:, full:].sum(dim=-1, keepdim=True)], dim=-1)
    cumulative = block_sums.cumsum(dim=-1, dtype=torch.float64)
    # u * total <= total exactly (u <= 1), so some block reaches it; the block before it stays below it.
    targets = uniforms.to(torch.float64).unsqueeze(-1) * cumulative[:, -1:]
    block = torch.searchsorted(cumulative, targets).clamp(max=cumulative.shape[-1] - 1)
    before = torch.where(block > 0, cumulative.gather(-1, (block - 1).clamp(min=0)), 0.0)
    # The share of the chosen block's mass below the target, in (0, 1].
    fraction = ((targets - before) / block_sums.gather(-1, block).to(torch.float64)).clamp(max=1.0)
    index = block * block_size + torch.arange(block_size, device=logits.device)
    inside = weights.gather(-1, index.clamp(max=vocab - 1)).masked_fill(index >= vocab, 0.0)
    inside = inside.cumsum(dim=-1, dtype=torch.float64)
    offset = torch.searchsorted(inside, fraction * inside[:, -1:]).clamp(max=block_size - 1)
    return (block * block_size + offset).squeeze(-1)


def sample_tokens(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, epsilon_cutoff: float = 0.0) -> torch.Tensor:
    """Returns one token per row, drawn from the warped distribution `generate(do_sample=True)` samples from.

    Args:
        logits (`torch.Tensor` of shape `(N, V)`): next-token logits.
        uniforms (`torch.Tensor` of shape `(N,)`): values in (0, 1], e.g. `1 - torch.rand(N)`.
        temperature, top_k, top_p, epsilon_cutoff: as in `warp_logits`.

    Returns: `torch.LongTensor` of shape `(N,)`.
    """
    return inverse_cdf_sample(warp_logits(logits.float(), temperature, top_k, top_p, epsilon_cutoff), uniforms)


def argmax_or_sample(logits: torch.Tensor, sample_rows: torch.Tensor | None, uniforms: torch.Tensor,
                     temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                     epsilon_cutoff: float = 0.0) -> torch.Tensor:
    """Returns the argmax of each row, and on the rows `sample_rows` a draw of `sample_tokens` instead.

    The rows are given by position, not by a bool mask, so that nothing waits for the device: a bool mask's
    selection has a size only the device knows (a host sync at every call).

    Args:
        logits (`torch.Tensor` of shape `(N, V)`).
        sample_rows (`torch.LongTensor` of shape `(S,)`, or None when every row samples): the sample rows, ascending.
        uniforms (`torch.Tensor` of shape `(S,)`, `(N,)` when `sample_rows` is None): each sample row's uniform.
    """
    logits = logits.float()
    if sample_rows is None:
        return sample_tokens(logits, uniforms, temperature, top_k, top_p, epsilon_cutoff)
    chosen = logits.argmax(dim=-1)
    if sample_rows.numel():
        drawn = sample_tokens(logits.index_select(0, sample_rows), uniforms, temperature, top_k, top_p, epsilon_cutoff)
        chosen = chosen.index_copy(0, sample_rows, drawn)
    return chosen


def draw_uniforms(steps: int, rows: int, device: torch.device | str,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """Returns uniforms in (0, 1] of shape `(steps, rows)`: one `torch.rand((steps, rows))` call on `device`'s
    RNG (the global one unless `generator` is given), so the RNG moves on by exactly that draw."""
    return 1.0 - torch.rand((steps, rows), device=device, generator=generator)


MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """Returns `x * constant mod 2**32` for int64 `x` in [0, 2**32), without int64 overflow (16-bit halves)."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + ((x * high) & 0xFFFF) * 65536) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Returns the `lowbias32` hash of each value of int64 `x` in [0, 2**32) (C. Wellons' integer hash: a bijection
    of the 32-bit integers whose every output bit depends on every input bit)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def stream_key(*parts: int) -> int:
    """Returns a 32-bit key folding the integers `parts` (e.g. seed, process, optimizer step) into one:
    `k = mix32(k ^ part)` from `k = 0`, each part taken mod 2**32."""
    key = torch.zeros((), dtype=torch.long)
    for part in parts:
        key = mix32(key ^ (int(part) & MASK32))
    return int(key)


def row_keys(stream: int, first_row: int, rows: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Returns the keys of rows `first_row .. first_row + rows - 1` of a stream: `mix32(stream ^ row)`, int64 of
    shape `(rows,)`; distinct rows of one stream get distinct keys (`mix32` is a bijection)."""
    index = torch.arange(first_row, first_row + rows, dtype=torch.long, device=device)
    return mix32((index & MASK32) ^ (stream & MASK32))


def keyed_uniforms(keys: torch.Tensor, steps: int) -> torch.Tensor:
    """Returns uniforms in (0, 1] of shape `(steps, R)`: `u[t, r] = (mix32(mix32(keys[r] ^ mix32(t + 1))) + 1) / 2**32`
    (float64), a function of the row's key and the step only.

    Args:
        keys (`torch.LongTensor` of shape `(R,)`): values in [0, 2**32), e.g. from `row_keys`.
    """
    step_hash = mix32(torch.arange(1, steps + 1, dtype=torch.long, device=keys.device)).unsqueeze(1)
    hashed = mix32(mix32(keys.unsqueeze(0) ^ step_hash))
    return (hashed.to(torch.float64) + 1.0) / 2.0**32


def rollout_uniforms(steps: int, rows: int, device: torch.device | str,
                     keys: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the uniforms of a decode, `(steps, rows)`: `keyed_uniforms(keys, steps)` when `keys` `(rows,)` are
    given, else `draw_uniforms(steps, rows, device)` (the global RNG)."""
    if keys is None:
        return draw_uniforms(steps, rows, device)
    if keys.shape != (rows,):
        raise ValueError(f"rollout_uniforms: {rows} sample rows need {rows} keys, got shape {tuple(keys.shape)}.")
    return keyed_uniforms(keys.to(device), steps)
