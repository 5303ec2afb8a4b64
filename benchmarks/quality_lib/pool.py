"""The units of a run in worker processes, and the JSON cache of finished units."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor


def cached(path: str, compute):
    """Returns the JSON value cached at `path`, computing and writing it (atomically) first when absent."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    value = json.loads(json.dumps(compute()))  # what a rerun will read back
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2)
    os.replace(path + ".tmp", path)
    return value


def run_units(command: list[str], units: list[tuple[str, int]], jobs: int):
    """Starts `command --arms ARM --seeds SEED` for every unit, `jobs` at a time, in the background; returns a
    future that raises if any of them failed."""

    finished = []

    def one(unit):
        arm, seed = unit
        done = subprocess.run(command + ["--arms", arm, "--seeds", str(seed)], stdout=subprocess.DEVNULL)
        if done.returncode:
            raise RuntimeError(f"the {arm} seed {seed} unit failed (exit {done.returncode}); its output is above")
        finished.append(unit)
        print(f"finished in a worker: {arm} seed {seed} ({len(finished)}/{len(units)})", flush=True)

    def run_all():
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as executor:
            for future in [executor.submit(one, unit) for unit in units]:
                future.result()

    return ThreadPoolExecutor(max_workers=1).submit(run_all)
