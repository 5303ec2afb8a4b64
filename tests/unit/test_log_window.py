"""The logged value of a metric over a logging window: means, and the window's extremes for `*_min` / `*_max`."""

import math

from hf_seqrl.trainers.services.log_window import window_rows, window_values


def test_one_process_means_and_extremes():
    buffer = {"rl/ratio_min": [1.0, 0.5, 0.8], "rl/ratio_max": [1.0, 1.5, 1.2], "rl/reward": [0.2, 0.4]}
    keys = sorted(buffer) + ["rl/kl"]  # a name recorded elsewhere only
    rows = window_rows(buffer, keys)
    assert rows[-1] == [0.0, 0, math.inf, -math.inf]
    values = window_values(keys, [rows])
    assert values.keys() == {"rl/ratio_min", "rl/ratio_max", "rl/reward"}  # rl/kl: no value, not logged
    assert (values["rl/ratio_min"], values["rl/ratio_max"]) == (0.5, 1.5)  # not the means 0.767 and 1.233
    assert math.isclose(values["rl/reward"], 0.3)


def test_processes_combine_counts_and_extremes():
    keys = ["rl/ratio_max", "rl/ratio_min", "rl/reward"]
    first = window_rows({"rl/ratio_min": [0.9], "rl/ratio_max": [1.1], "rl/reward": [1.0, 1.0, 1.0]}, keys)
    second = window_rows({"rl/ratio_min": [0.7, 1.0], "rl/ratio_max": [1.3, 1.0], "rl/reward": [0.0]}, keys)
    values = window_values(keys, [first, second])
    # the mean weighs every value once (3 ones and a zero: 0.75, not the mean of the processes' means, 0.5)
    assert values == {"rl/ratio_max": 1.3, "rl/ratio_min": 0.7, "rl/reward": 0.75}
    # a name only one process recorded: the other's empty row changes nothing
    only = window_rows({"rl/ratio_min": [0.6]}, ["rl/ratio_min"])
    empty = window_rows({}, ["rl/ratio_min"])
    assert window_values(["rl/ratio_min"], [empty, only]) == {"rl/ratio_min": 0.6}
