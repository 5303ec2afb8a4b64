"""The metrics of one logging window over processes: each process's sums, counts and extremes
(`window_rows`), then the logged values from all of them (`window_values`)."""

from __future__ import annotations

import math


def window_rows(buffer: dict[str, list[float]], keys: list[str]) -> list[list[float]]:
    """Returns, for each name of `keys`, `[sum, count, smallest, largest]` of its values recorded in `buffer`
    (`[0, 0, inf, -inf]` for a name without values): one process's part of a logging window."""
    rows = []
    for key in keys:
        values = buffer.get(key, [])
        rows.append([math.fsum(values), len(values), min(values, default=math.inf), max(values, default=-math.inf)])
    return rows


def window_values(keys: list[str], rows: list[list[list[float]]]) -> dict[str, float]:
    """Returns the logged value of each name of `keys` from the processes' `window_rows` (`rows[p][k]`): the smallest
    value of a name ending in `_min`, the largest of one ending in `_max`, the mean of any other; a name no process
    recorded is left out."""
    values = {}
    for k, key in enumerate(keys):
        total, count = math.fsum(part[k][0] for part in rows), sum(part[k][1] for part in rows)
        if not count:
            continue
        if key.endswith("_min"):
            values[key] = min(part[k][2] for part in rows)
        elif key.endswith("_max"):
            values[key] = max(part[k][3] for part in rows)
        else:
            values[key] = total / count
    return values
