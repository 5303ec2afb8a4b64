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


def run_units_stage(script: str, args, work_dir: str, units: list[tuple[str, int, str]], unit, stages: Stages,
                    name: str, start: float) -> list[dict]:
    """Runs the stage `name` of a benchmark script (`HERE/script`): the units `(arm, seed, cache path)` not cached yet,
    `args.jobs` at a time as `--runs-only` processes of the script (with `args.jobs == 1`, `unit(arm, seed)` here),
    each printed as it finishes; returns every unit's record, in `units`' order."""
    import sys

    from .pool import cached, run_units
    from .settings import HERE

    todo = [(arm, seed) for arm, seed, path in units if not os.path.exists(path)]
    print(f"units: {len(units) - len(todo)} of {len(units)} cached, {len(todo)} to run", flush=True)

    def run_all():
        if args.jobs > 1:
            child = [sys.executable, os.path.join(HERE, script), "--data-dir", args.data_dir, "--work-dir", work_dir,
                     "--threads", str(args.threads), "--device", args.device, "--runs-only"]
            child += (["--quick"] if args.quick else []) + (["--dev-only"] if args.dev_only else [])
            child += ["--set", *args.set] if args.set else []
            run_units(child, todo, args.jobs).result()
        for done, (arm, seed, path) in enumerate(units, 1):
            cached(path, lambda: unit(arm, seed))
            print(f"unit {done}/{len(units)}: {arm} seed {seed} ({time.time() - start:.0f} s)", flush=True)

    stages.run(name, not todo, run_all)
    return [cached(path, None) for _, _, path in units]


def arms_summary(settings, c_eval: dict, runs: list[dict], arms: tuple[str, ...]) -> dict:
    """Returns `report.summarize` of the units, its arms in `arms`' order, each with its units' wall-clock (training
    and scoring) as `unit_seconds`."""
    from .report import summarize

    summary = summarize(settings, c_eval, runs)
    summary["arms"] = {arm: {**summary["arms"][arm], "unit_seconds": spread(
        [r["unit_seconds"] for r in runs if r["arm"] == arm])} for arm in arms if arm in summary["arms"]}
    return summary


def prepare_run(args, settings, name: str, default_work_dir: str):
    """Returns `(settings, overrides, work_dir, output, suffix)` of a benchmark run on Multi30k: `settings` with the
    `--seeds` and `--set` overrides, the work directory (`--work-dir`, else `default_work_dir` tagged by the overrides
    of C's fields), created; the results path (`--output`, else `results/NAME[_cuda].json`, `--quick` into the work
    directory) and the units' name suffix (`_dev` with `--dev-only`). Exits naming `--data-dir` without the data."""
    import sys
    from dataclasses import replace

    from .settings import ANNEAL_FIELDS, C_FIELDS, HERE, apply_overrides, run_tag

    if args.seeds:
        settings = replace(settings, seeds=tuple(args.seeds))
    settings, overrides = apply_overrides(settings, args.set)
    if not os.path.isdir(os.path.join(args.data_dir, "multi30k")):
        sys.exit(f"No multi30k data in {args.data_dir}: pass --data-dir (see ../shared/data/README.md).")
    c_tag = run_tag(None, {k: v for k, v in overrides.items() if k in C_FIELDS + ANNEAL_FIELDS})
    work_dir = args.work_dir or default_work_dir + c_tag
    name += "_cuda" if args.device == "cuda" and not args.quick else ""
    output = args.output or (os.path.join(work_dir, f"{name}.json") if args.quick
                             else os.path.join(HERE, "results", f"{name}.json"))
    os.makedirs(work_dir, exist_ok=True)
    return settings, overrides, work_dir, output, "_dev" if args.dev_only else ""


def work_dir_of(name: str, quick: bool, device: str) -> str:
    """Returns the default work directory of the benchmark `name`: benchmarks/cache/NAME[_quick|_cuda]."""
    from .settings import HERE

    return os.path.join(HERE, "cache", name + ("_quick" if quick else "") + ("_cuda" if device == "cuda" and not quick
                                                                            else ""))


def benchmark_parser(description: str, name: str, arms: tuple[str, ...], dev_only_help: str, device_help: str,
                     set_example: str):
    """Returns the command line of a benchmark built on `quality_lib` that runs `arms` x seeds units from cached
    stages (`name`: its cache and results name): --quick, --data-dir, --work-dir, --output, --arms, --seeds,
    --runs-only, --dev-only, --jobs, --threads, --c-threads, --device, --set."""
    import argparse

    from .settings import DEFAULT_DATA

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run on a slice of the data")
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--work-dir", default=None, help="cache of the stages and units "
                        f"(default benchmarks/cache/{name}[_quick|_cuda])")
    parser.add_argument("--output", default=None, help=f"results JSON (default benchmarks/results/{name}[_cuda].json; "
                        "--quick writes into the work dir)")
    parser.add_argument("--arms", nargs="+", choices=arms, default=list(arms))
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--runs-only", action="store_true", help="run the selected units only (from the cached "
                        "stages): what the worker processes run; a run without it writes the results")
    parser.add_argument("--dev-only", action="store_true", help="score the units on dev only (greedy), to choose "
                        "learning rates or the budget on dev; units named *_dev, results in *_dev.json"
                        + dev_only_help)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="units run in this many processes at once (default 2: the benchmark's 2 cores)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each unit")
    parser.add_argument("--c-threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads of the stages before the units (alone): default every core")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help=device_help)
    parser.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                        help=f"override settings as quality.py does (e.g. --set {set_example}); overrides of C's "
                        "fields get a work directory of their own")
    return parser
