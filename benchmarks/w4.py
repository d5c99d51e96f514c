"""W4, DP overhead: W1 with ``bounded`` against W1 with ``none`` in the same executor (fairclip's
Ray executor: one Ray cluster and one set of actors that switch policy between runs).

Each policy first runs once unmeasured: the first rounds of the actors' process pay one-time
costs (lazy imports, torch's first kernels, the allocator's growth) that landed on whichever
policy ran first -- ``bounded`` in the first repeat, whose overhead read +11 to +21 % in four
runs while the other repeats read -3 to +7 %. Each of ``repeats`` repeats then runs the two
policies back to back on the same sampled clients, in alternating order. The overhead is the
median over the repeats of ``bounded``'s wall time over ``none``'s in the same repeat, minus 1:
the machine's load drifts by 10-30 % between runs, and a pair run within seconds of each other
sees the same load (the fastest repeat of each policy, the figure in the table, once made one
lucky ``none`` repeat read as +21 %). Every repeat pays its own privacy accounting (the
accounting caches are cleared before each), as a single run does: ε after the last round (PRV,
q = 0.1, T = 5, 0.025 s of CPU) is computed by the run's server in a background thread while
the rounds run.
Target: ``bounded`` costs at most 5 % more wall time than ``none``.
"""

from __future__ import annotations

from .common import Measurement
from .w1 import UNIT, settings

POLICIES = ("bounded", "none")


def run_pair(quick: bool) -> dict[str, Measurement]:
    import statistics
    import time

    # in the workload's own child process only (torch, ray, flwr: not in `fairclip bench`'s)
    from fairclip.strategies.accounting import clear_caches

    from .common import Measurement, TreeMemorySampler, alternate, self_peak_rss_bytes
    from .imagetask import build_task, image_config, ray_executor
    from .timing import start_ray, timed_rounds

    started = time.perf_counter()
    sampler = TreeMemorySampler().__enter__()
    repeats = 1 if quick else 7
    cores = start_ray()
    configs = {policy: image_config(settings(quick, policy)) for policy in POLICIES}
    task = build_task(configs["none"])
    executor = ray_executor(configs["none"], cores)
    runs: dict[str, list[tuple[float, dict]]] = {policy: [] for policy in POLICIES}
    warm_up_s = {}
    for policy in POLICIES:  # unmeasured: a process's first rounds pay one-time costs
        executor.set_policy(configs[policy])
        clear_caches()
        warm_up_s[policy] = timed_rounds(configs[policy], task, executor)[0]
    for repeat in range(repeats):
        for policy in alternate(POLICIES, repeat):
            executor.set_policy(configs[policy])
            clear_caches()
            runs[policy].append(timed_rounds(configs[policy], task, executor))
    sampler.__exit__(None, None, None)
    total = time.perf_counter() - started
    peak = max(sampler.peak, self_peak_rss_bytes())
    paired = [b[0] / n[0] - 1 for b, n in zip(runs["bounded"], runs["none"], strict=True)]
    results = {}
    for policy in POLICIES:
        seconds, details = min(runs[policy], key=lambda run: run[0])
        details.update(
            executor="ray",
            policy=policy,
            repeats=repeats,
            all_wall_s=[run[0] for run in runs[policy]],
            warm_up_wall_s=warm_up_s[policy],
        )
        details["total_s_note"] = "total_s: the whole W4 process (both policies, all repeats)"
        if policy == "bounded":
            details["paired_overheads"] = paired
            details["overhead"] = statistics.median(paired)
        work = details["client_updates"]
        results[policy] = Measurement(work / seconds, UNIT, seconds, total, work, peak, details)
    return results


CONTENDERS = {"pair": run_pair}
