"""What the benchmarks built on `quality_lib` share outside the units: the wall-clock record of their stages and the
spread of a value over seeds."""

from __future__ import annotations

import json
import os
import statistics
import time


class Stages:
    """The wall-clock of each stage, kept in `work_dir/stages.json`: the seconds of the invocations that worked on it,
    summed (a stage found done is not timed again; an invocation killed midway leaves its seconds out)."""

    def __init__(self, work_dir: str):
        self.path = os.path.join(work_dir, "stages.json")
        self.seconds = {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.seconds = json.load(f)

    def run(self, name: str, done: bool, compute):
        clock = time.time()
        value = compute()
        if not done:
            self.seconds[name] = self.seconds.get(name, 0) + round(time.time() - clock)
            with open(self.path + ".tmp", "w") as f:
                json.dump(self.seconds, f, indent=2)
            os.replace(self.path + ".tmp", self.path)
            print(f"stage {name}: {self.seconds[name]} s", flush=True)
        return value


def spread(values: list[float]) -> dict:
    """Returns the mean (2 decimals), min, max and the values themselves."""
    return {"mean": round(statistics.mean(values), 2), "min": min(values), "max": max(values), "values": values}
