"""The runner: every contender of the chosen workloads in a subprocess of its own, one table,
one JSON report.

``fairclip bench [w1 ... w6] [--quick] [--json FILE] [--device cpu|cuda]`` (:mod:`fairclip.cli`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fairclip.atomic import atomic_write_text
from fairclip.scenarios.errors import ConfigError

from .common import BUSY_FRACTION, REPO_ROOT, RESULT_MARKER, OtherLoad, machine_info, usable_cores
from .w2 import MODELS as W2_MODELS
from .w2 import contender_name as w2_name
from .w6 import MODEL_SIZES
from .w6 import contender_name as w6_name

W6_MODELS = tuple(MODEL_SIZES)

WORKLOADS = ("w1", "w2", "w3", "w4", "w5", "w6")
PACKAGE = __package__ or "benchmarks"

DESCRIPTIONS = {
    "w1": "cross-device: 1,000 clients × 64 images 28×28, ~100/round, 5 rounds, W1 CNN, bounded",
    "w2": "DP-SGD: 3 CNNs, 60,000 examples, 100/50/20 Poisson batches of 256, clip 1, σ 0.8; 5 pairs",
    "w3": "scale: 100,000 clients, ~1,000/round; 10^9 and 10^6 clients, 10^4/round; bounded, in-process",
    "w4": "DP overhead: W1 with bounded vs none, fairclip's Ray executor",
    "w5": "scale-out: W1 on 1 vs 2 Ray actors, local and on single-CPU nodes of a cluster; 7 pairs",
    "w6": "secure aggregation: one round's exchange, SecAgg+ vs plain, d = 22 / 26,010 / 269,322, 10 clients",
}
QUICK_DESCRIPTIONS = {
    "w1": "quick: 40 clients × 16 images, q 0.25, 2 rounds",
    "w2": "quick: 2,048 examples, 3 or 2 steps, 1 pair",
    "w3": "quick: 10,000 clients, q 0.01, 5 / 2 rounds; 10^9 and 10^6 clients, 100/round, 2 rounds",
    "w4": "quick: as W1 quick, 1 repeat",
    "w5": "quick: as W1 quick, 1 pair",
    "w6": "quick: 5 clients, 1 repeat",
}
CONTENDERS = {
    "w1": ("fairclip", "flower", "floor", "pfl"),
    "w2": (*W2_MODELS, "fairclip-ray", "fairclip-local"),  # a model's child reports its four contenders
    "w3": ("bimodal-mean", "logistic", "logistic-1e9", "logistic-1e6"),
    "w4": ("pair",),
    "w5": ("local", "cluster", "floors"),
    "w6": W6_MODELS,  # a model's child reports its plain and secure contenders
}
QUICK_SKIPS = {
    ("w1", "flower"): "skipped in --quick (Flower's runtime start alone takes ~30 s)",
    ("w2", "fairclip-local"): "skipped in --quick (same one-step path as w2.fairclip)",
}
GPU_SKIPS = {
    ("w2", "fairclip-local"): "skipped with --device cuda (w2.fairclip runs one worker on the GPU already)",
}
DEVICES = ("cpu", "cuda")
GPU_WORKLOADS = ("w2",)
"""The workloads that run on a GPU with ``--device cuda``; the others measure CPU executors."""
TIMEOUT_S = {"w1": 1800, "w2": 1200, "w3": 1200, "w4": 1800, "w5": 1800, "w6": 900}
W5_SPEEDUP = 1.6  # on one 2-core machine (decided 2026-12)
W3_MEMORY_LIMIT = 4 * 2**30
W3_POPULATION_SLOWDOWN = 1.5
"""The million-client run's rounds/s over the billion-client run's, at most."""
W4_OVERHEAD_LIMIT = 0.05


# ----- running ----------------------------------------------------------------------------------


def run_contender(
    workload: str, contender: str, quick: bool, env: dict[str, str] | None = None, device: str = "cpu"
) -> dict[str, dict[str, Any]]:
    """{contender name: result} of one child process (W4's child reports two contenders), with
    ``env`` added to this process's environment."""
    command = [sys.executable, "-m", f"{PACKAGE}.child", workload, contender, *(["--quick"] if quick else [])]
    if device != "cpu":
        command += ["--device", device]
    started = time.perf_counter()
    # A session of its own, so that a child that times out goes with everything it started
    # (Ray's processes, Flower's SuperLink, torchrun's workers).
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S[workload])
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        process.communicate()
        return {contender: {"status": f"failed: no result within {TIMEOUT_S[workload]} s"}}
    finally:
        _kill_group(process.pid)
    completed = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    elapsed = time.perf_counter() - started
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            data = json.loads(line[len(RESULT_MARKER) :])
            if "throughput" in data:
                return {contender: {"status": "ok", "process_s": elapsed, **data}}
            return {name: {"status": "ok", "process_s": elapsed, **value} for name, value in data.items()}
        if line.startswith("BENCH-UNAVAILABLE "):
            return {contender: {"status": "unavailable: " + line.split(" ", 1)[1]}}
    tail = (completed.stdout + completed.stderr).strip().splitlines()[-12:]
    return {contender: {"status": f"failed (exit {completed.returncode})", "log_tail": tail}}


def _kill_group(pid: int) -> None:
    """End what a finished or timed-out child left behind (its own process group only)."""
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _value(results: dict[str, dict[str, Any]], name: str, key: str = "throughput") -> float | None:
    result = results.get(name, {})
    value = result.get(key) if result.get("status") == "ok" else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def targets(workload: str, results: dict[str, dict[str, Any]], cores: int) -> list[dict[str, Any]]:
    """The workload's targets with their measured values (``met`` is None when unmeasured)."""
    rows: list[dict[str, Any]] = []

    def quotient(top: str, bottom: str) -> float | None:
        a, b = _value(results, top), _value(results, bottom)
        return a / b if a is not None and b else None

    # ``paired``: the median of paired repeats' ratios where the workload measured it (W2, W5),
    # which then stands for the fastest runs' ratio of ``top`` over ``bottom``.
    def ratio(
        name: str, top: str, bottom: str, at_least: float, text: str, paired: float | None = None
    ) -> None:
        value = paired if paired is not None else quotient(top, bottom)
        met = None if value is None else value >= at_least
        rows.append({"name": name, "value": value, "target": text, "threshold": at_least, "met": met})

    def reference(name: str, top: str, bottom: str, paired: float | None = None) -> None:
        """A ratio reported for reading the targets, with no target of its own."""
        value = paired if paired is not None else quotient(top, bottom)
        rows.append({"name": name, "value": value, "target": "(reference)", "threshold": None, "met": None})

    def at_most(name: str, top: str, bottom: str, limit: float, paired: float | None = None) -> None:
        value = paired if paired is not None else quotient(top, bottom)
        met = None if value is None else value <= limit
        rows.append({"name": name, "value": value, "target": f"≤ {limit:g}", "threshold": limit, "met": met})

    if workload == "w1":
        ratio("fairclip/flower", "fairclip", "flower", 4.0, "≥ 4")
        ratio("fairclip/floor", "fairclip", "floor", cores / 1.3, f"≥ cores/1.3 = {cores / 1.3:.2f}")
        ratio("fairclip/pfl", "fairclip", "pfl", 1.0, "≥ 1")
    elif workload == "w2":
        # Medians of the paired repeats' ratios (benchmarks/w2.py); else the fastest runs' ratio.
        for model in W2_MODELS:
            prefix = "" if model == "tanh-cnn" else f"{model}: "
            fairclip = w2_name(model, "fairclip")
            opacus, ghost, sgd = (w2_name(model, c) for c in ("opacus", "opacus-ghost", "sgd"))
            fairclip_result = results.get(fairclip, {})
            ok = fairclip_result.get("status") == "ok"
            medians = (fairclip_result.get("paired_medians") or {}) if ok else {}
            # Targets (decided 2026-12): at least as fast as the faster of Opacus' two modes (its
            # hooks or its ghost clipping), and at most 1.5 times plain SGD's time per example.
            faster = medians.get("fairclip/faster-opacus")
            if faster is None:
                speeds = [_value(results, name) for name in (opacus, ghost)]
                best = max((s for s in speeds if s is not None), default=None)
                mine = _value(results, fairclip)
                faster = mine / best if mine is not None and best else None
            rows.append(
                {
                    "name": f"{prefix}fairclip/faster Opacus mode",
                    "value": faster,
                    "target": "≥ 1",
                    "threshold": 1.0,
                    "met": None if faster is None else faster >= 1.0,
                }
            )
            reference(f"{prefix}fairclip/opacus", fairclip, opacus, medians.get("fairclip/opacus"))
            reference(f"{prefix}fairclip/opacus-ghost", fairclip, ghost, medians.get("fairclip/opacus-ghost"))
            at_most(
                f"{prefix}sgd/fairclip (time per example)", sgd, fairclip, 1.5, medians.get("sgd/fairclip")
            )
        ratio("fairclip-ray/opacus", "fairclip-ray", "opacus", 1.0, "≥ 1 (reference)")
        ratio("fairclip-local/opacus", "fairclip-local", "opacus", 1.0, "≥ 1 (reference)")
    elif workload == "w3":
        for name in CONTENDERS["w3"]:
            peak = _value(results, name, "peak_rss_bytes")
            rows.append(
                {
                    "name": f"{name} peak RSS (GiB)",
                    "value": None if peak is None else peak / 2**30,
                    "target": "< 4 GiB",
                    "threshold": W3_MEMORY_LIMIT / 2**30,
                    "met": None if peak is None else peak < W3_MEMORY_LIMIT,
                }
            )
        at_most(
            "logistic-1e6/logistic-1e9 (rounds/s)", "logistic-1e6", "logistic-1e9", W3_POPULATION_SLOWDOWN
        )
    elif workload == "w4":
        # The median of the repeats' paired overheads (benchmarks/w4.py); else the walls' ratio.
        overhead = _value(results, "bounded", "overhead")
        bounded, none = _value(results, "bounded", "wall_s"), _value(results, "none", "wall_s")
        if overhead is None and bounded is not None and none:
            overhead = bounded / none - 1
        rows.append(
            {
                "name": "bounded wall / none wall − 1 (median of pairs)",
                "value": overhead,
                "target": "≤ 5 %",
                "threshold": W4_OVERHEAD_LIMIT,
                "met": None if overhead is None else overhead <= W4_OVERHEAD_LIMIT,
            }
        )
    elif workload == "w5":
        # The median of paired repeats' speed-ups (benchmarks/w5.py); else the fastest runs' ratio.
        for name, two, one in (
            ("actors-2/actors-1 (median of pairs)", "actors-2", "actors-1"),
            ("nodes-2/node-1 (median of pairs)", "nodes-2", "node-1"),
        ):
            ratio(name, two, one, W5_SPEEDUP, f"≥ {W5_SPEEDUP}", _value(results, two, "speedup"))
        reference(
            "floors-2/floor-1 (the machine's own scale-out)",
            "floors-2",
            "floor-1",
            _value(results, "floors-2", "speedup"),
        )
        reference("actors-1/floor-1", "actors-1", "floor-1")
        reference("actors-2/floors-2", "actors-2", "floors-2")
    elif workload == "w6":
        # Figures for the record (issue 69 sets no target): what SecAgg+ costs against plain.
        for model in W6_MODELS:
            secure, plain = w6_name(model, "secure"), w6_name(model, "plain")
            reference(f"{model}: secure/plain (rounds/s)", secure, plain)
            for way in ("up", "down"):
                a = _value(results, secure, f"bytes_{way}_per_client")
                b = _value(results, plain, f"bytes_{way}_per_client")
                rows.append(
                    {
                        "name": f"{model}: secure/plain (bytes {way} per client)",
                        "value": a / b if a is not None and b else None,
                        "target": "(reference)",
                        "threshold": None,
                        "met": None,
                    }
                )
    return rows


def check_device(device: str, workloads: list[str]) -> None:
    """A :class:`ConfigError` unless ``device`` is known, every workload runs on it, and torch sees a
    GPU where it is ``cuda``: checked before any contender starts."""
    if device not in DEVICES:
        raise ConfigError(f"--device: {device!r} is not one of {', '.join(DEVICES)}")
    if device == "cpu":
        return
    cpu_only = [w for w in workloads if w not in GPU_WORKLOADS]
    if cpu_only:
        raise ConfigError(
            f"--device {device}: {', '.join(cpu_only)} measure(s) CPU executors; only "
            f"{', '.join(GPU_WORKLOADS)} runs on a GPU"
        )
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"--device {device}, but torch sees no CUDA device")


def run_bench(
    workloads: list[str], quick: bool, json_path: Path | None, device: str = "cpu"
) -> dict[str, Any]:
    """Run ``workloads`` (empty: all of them), print the table, write ``json_path``; return the report.

    ``device`` ``cuda`` runs W2's contenders on the GPU (:mod:`benchmarks.w2`; the only workload that
    takes one); the report then names the GPU (``machine.gpu``) and its targets are figures of
    record, set for this project's 2-core CPU machine.

    The report holds ``machine``, ``throughput`` (``"w1.fairclip"`` and so on: the measured
    throughput of every contender, None where it did not run), ``workloads`` (per workload its
    contenders' figures -- throughput, wall times, peak memory -- and its targets) and ``targets``
    (all targets, flat). ``json_path`` is rewritten (atomically) as each contender finishes, with
    ``complete`` false until the end: a stopped run keeps every figure measured before it.
    """
    chosen = [w.lower() for w in workloads] or list(WORKLOADS)
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        raise ConfigError(f"unknown workload(s) {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
    check_device(device, chosen)
    cores = usable_cores()
    others = OtherLoad()
    report: dict[str, Any] = {
        "command": " ".join(
            [
                "fairclip bench",
                *chosen,
                *(["--quick"] if quick else []),
                *(["--device", device] if device != "cpu" else []),
            ]
        ),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "device": device,
        "machine": machine_info(),
        "throughput": {},
        "workloads": {},
        "targets": [],
        "complete": False,
    }
    for workload in chosen:
        started = time.perf_counter()
        results: dict[str, dict[str, Any]] = {}
        for contender in CONTENDERS[workload]:
            skip = QUICK_SKIPS.get((workload, contender)) if quick else None
            skip = skip or (GPU_SKIPS.get((workload, contender)) if device != "cpu" else None)
            if skip:
                results[contender] = {"status": skip}
                continue
            _progress(f"{workload} {contender} ...")
            results.update(run_contender(workload, contender, quick, device=device))
            others.per_process()  # what a background job that ends later has used so far
            report["workloads"][workload] = {"contenders": results}  # its targets come at its end
            _save(report, json_path)
        rows = targets(workload, results, cores)
        report["workloads"][workload] = {
            "description": (QUICK_DESCRIPTIONS if quick else DESCRIPTIONS)[workload],
            "contenders": results,
            "targets": rows,
            "wall_s": time.perf_counter() - started,
        }
        for name in results:
            report["throughput"][f"{workload}.{name}"] = _value(results, name)
        report["targets"] += [{"workload": workload, **row} for row in rows]
    report["machine"]["load_average_after"] = machine_info()["load_average"]
    report["other_load"] = others.measure()
    report["other_load"]["idle_enough"] = report["other_load"]["fraction"] <= BUSY_FRACTION
    pfl = report["workloads"].get("w1", {}).get("contenders", {}).get("pfl", {})
    if pfl.get("pfl_version"):  # pfl lives in a venv of its own (benchmarks/setup_pfl.sh)
        report["machine"]["libraries"]["pfl"] = pfl["pfl_version"]
    report["complete"] = True
    print_table(report)
    _save(report, json_path)
    return report


def _save(report: dict[str, Any], json_path: Path | None) -> None:
    """Write the report as it stands (atomically: a reader sees the old or the new one)."""
    if json_path is not None:
        json_path = Path(json_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(json_path, json.dumps(report, indent=2, default=str) + "\n")


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ----- output ---------------------------------------------------------------------------------


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    machine = report["machine"]
    title = (
        f"fairclip bench{' --quick' if report['quick'] else ''} — {machine['cpu']}, "
        f"{machine['cores']} cores, load {machine['load_average']}"
        + (f", {report['device']}: {machine.get('gpu')}" if report.get("device", "cpu") != "cpu" else "")
    )
    table = Table(title=title, show_lines=False)
    for column in ("workload", "contender", "throughput", "unit", "wall s", "peak MiB", "status"):
        table.add_column(
            column, justify="right" if column in ("throughput", "wall s", "peak MiB") else "left"
        )
    for workload, data in report["workloads"].items():
        for name, result in data["contenders"].items():
            ok = result.get("status") == "ok"
            table.add_row(
                workload,
                name,
                _number(result.get("throughput")) if ok else "–",
                result.get("unit", "") if ok else "",
                _number(result.get("wall_s")) if ok else "–",
                _number(result.get("peak_rss_mib")) if ok else "–",
                result.get("status", ""),
            )
    targets_table = Table(title="targets")
    for column in ("workload", "measure", "value", "target", "met?"):
        targets_table.add_column(column)
    for row in report["targets"]:
        met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "–"}[row["met"]]
        value = row["value"]
        shown = f"{value:+.1%}" if row["workload"] == "w4" and value is not None else _number(value)
        targets_table.add_row(row["workload"], row["name"], shown, row["target"], met)
    console = Console(width=max(120, Console().width))
    console.print(table)
    console.print(targets_table)
    libraries = ", ".join(f"{k} {v}" for k, v in machine["libraries"].items() if v)
    console.print(f"machine: {machine['platform']}, Python {machine['python']}; {libraries}")
    others = report.get("other_load")
    if others and not others["idle_enough"]:
        busiest = ", ".join(
            f"pid {p['pid']} ({p['name']}) {p['core_seconds']:.0f} s" for p in others["busiest"]
        )
        console.print(
            f"[bold red]warning:[/bold red] processes running before the benchmark took "
            f"{others['core_seconds']:.0f} core-seconds ({others['fraction']:.0%} of the machine) "
            f"while it ran ({busiest}): these timings are not an idle machine's; rerun on an idle one"
        )


def failed_contenders(report: dict[str, Any]) -> list[str]:
    """``workload.contender`` of every contender whose child process failed."""
    return [
        f"{w}.{name}"
        for w, data in report["workloads"].items()
        for name, result in data["contenders"].items()
        if str(result.get("status", "")).startswith("failed")
    ]
