"""Committed reproduction results, and the pages made from them.

A finished ``fairclip reproduce`` folder holds every run and its tables. What outlives the
machine is small: :func:`record` copies ``reproduction.csv`` and ``reproduction.md`` into
``results/reproductions/<setup>/`` of the repository with ``record.json``: the command, seeds,
machine, the commits of the runs (``None`` for a copy without git) and of the recording, the
date, and the compute time summed over the runs' own wall times, which ``--resume`` pieces do
not lose. :func:`results_markdown` renders every recorded setup as the
reproduction tables the documentation site shows (its reproductions page is generated from the
committed files when the site builds), and :func:`write_claims_page` writes ``docs/claims.md``::

    python -m tools.results record runs/xu-dutch xu-dutch \
        --command "fairclip reproduce xu-dutch --seeds 3"
    python -m tools.results claims

A record keeps its runs' per-seed values (``per_seed.csv``), so paired metrics or claims added
to its setup afterwards need no runs: :func:`retabulate` (``python -m tools.results retabulate
NAME``) forms them and writes the record's tables, claims and report again. The notes of a
recorded report follow its setup file through :func:`refresh_notes` (``notes NAME``).

A reproduction of many hours outlives the session that started it through :func:`keep`: it
copies what ``--resume`` needs -- the folder's ``sweep.json`` and each *finished* run's
``summary.json`` -- into ``results/in-progress/<setup>/`` with ``progress.json`` (runs
finished, their compute time and commits). A fresh clone continues it with::

    python -m tools.results keep runs/esipova-skewed-mnist esipova-skewed-mnist
    cp -r results/in-progress/esipova-skewed-mnist runs/esipova-skewed-mnist
    fairclip reproduce --resume --out runs/esipova-skewed-mnist
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
import sys
from itertools import groupby
from pathlib import Path
from typing import Any

import pandas as pd

from fairclip.atomic import atomic_write_text, write_json
from fairclip.scenarios.errors import ConfigError
from fairclip.server.provenance import git_commit, machine
from fairclip.sims.reproduce.claims import COMPARABLE_EPSILON, claims_markdown, fairest_markdown
from fairclip.sims.reproduce.paired_metrics import add_paired_metrics
from fairclip.sims.reproduce.reproduction import RUN_KEYS_FILE, merge_specs
from fairclip.sims.reproduce.setups import PolicySetup, builtin_setups, load_setup
from fairclip.sims.reproduce.tables import (
    POINTS,
    notes_line,
    paired_metric_rows,
    paper_columns,
    reference_policy,
    target_texts,
    tolerance,
    write_outputs,
)
from fairclip.sims.sweeps.folder import canonical_spec, read_table

REPOSITORY = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPOSITORY / "results" / "reproductions"
IN_PROGRESS_DIR = REPOSITORY / "results" / "in-progress"
FILES = ("reproduction.csv", "reproduction.md")
OPTIONAL_FILES = ("paired_tests.csv", "per_seed.csv", "claims.csv", "fairest.csv")
"""Copied where the reproduction wrote them (those tabulated before the paired tests, or before
the claims, have none)."""
CLAIMS_PAGE = REPOSITORY / "docs" / "claims.md"
"""The generated page of every paper's claims and the fairest policy per setup (:func:`claims_page`)."""


def record(out: Path, dest: Path, command: str) -> dict[str, Any]:
    """Copy the tables of the reproduction in ``out`` into ``dest`` with its ``record.json``;
    return the record. The reproduction must be finished (its tables written) and not a smoke
    run (:func:`refuse_smoke_run`)."""
    out, dest = Path(out), Path(dest)
    missing = [name for name in FILES if not (out / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{out} holds no {missing[0]}: the reproduction has not finished")
    spec = (
        canonical_spec(json.loads((out / "sweep.json").read_text()), quiet=True)
        if (out / "sweep.json").is_file()
        else {}
    )
    refuse_smoke_run(out, spec)
    summaries = [json.loads(path.read_text()) for path in _summary_paths(out)]
    table = read_table(out / "reproduction.csv", keep_default_na=False)
    started = [s["provenance"]["started"] for s in summaries if "provenance" in s]
    runs = _runs_provenance(summaries)
    entry = {
        "setup": str(table["setup"].iloc[0]) if len(table) else dest.name,
        "command": command,
        "seeds": int(table["seeds"].max()) if len(table) else 0,
        "runs": len(summaries),
        "compute_seconds": runs["compute_seconds"],
        "first_run_started": min(started) if started else None,
        "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "run_commits": runs["run_commits"],
        "recorded_at_commit": git_commit(),
        "machine": runs["machine"] or machine(),
        "machines": runs["machines"],
        "specification": spec,
    }
    dest.mkdir(parents=True, exist_ok=True)
    for name in FILES + tuple(name for name in OPTIONAL_FILES if (out / name).is_file()):
        shutil.copyfile(out / name, dest / name)
    write_json(dest / "record.json", entry)
    return entry


def _summary_paths(out: Path) -> list[Path]:
    """The ``summary.json`` of each run of the reproduction in ``out``: those its ``runs.json``
    names (a :class:`FileNotFoundError` for one missing), or, in a folder written before
    ``runs.json`` was, every run in the folder."""

    if not (out / RUN_KEYS_FILE).is_file():
        return sorted((out / "runs").glob("*/summary.json"))
    listed = json.loads((out / RUN_KEYS_FILE).read_text())
    paths = [out / "runs" / key / "summary.json" for key in [*listed["grid"], *listed["final"]]]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(
                f"{out}: run {path.parent.name}, named in {RUN_KEYS_FILE}, has no summary.json"
            )
    return paths


def _runs_provenance(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """What the runs' summaries say of where they ran: their wall times summed
    (``compute_seconds``, which ``--resume`` pieces do not lose), their commits, the machine of
    the first that names one (None if none does), and every machine (:func:`_machines`)."""
    machines = _machines(summaries)
    return {
        "compute_seconds": round(sum(float(s["provenance"]["wall_seconds"]) for s in summaries), 1),
        "run_commits": sorted({str(s.get("provenance", {}).get("git_commit")) for s in summaries}),
        "machine": machines[0]["machine"] if machines else None,
        "machines": machines,
    }


def _machines(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry for each distinct machine and training device the runs name, in the runs'
    order: the machine, the device (``provenance.execution.device``; None in a summary written
    before it was recorded), how many runs ran there and their run time there. A reproduction
    continued on another machine (a GPU's, say) names both, so its run time is not read as one
    machine's; so does a run continued from its checkpoint on another machine: each of its
    ``provenance.pieces`` counts where it ran, and the run counts on each of those machines."""
    found: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        where = summary.get("provenance", {})
        if "machine" not in where:
            continue
        counted: set[str] = set()
        for host, device, seconds in _where_each_piece_ran(where):
            key = json.dumps([host, device], sort_keys=True)
            empty = {"machine": host, "device": device, "runs": 0, "seconds": 0.0}
            entry = found.setdefault(key, empty)
            if key not in counted:
                entry["runs"] += 1
                counted.add(key)
            entry["seconds"] += seconds
    return [{**entry, "seconds": round(entry["seconds"], 1)} for entry in found.values()]


def _where_each_piece_ran(where: dict[str, Any]) -> list[tuple[dict[str, Any], str | None, float]]:
    """(machine, training device, run time) of each piece of a run's ``provenance``: the run's
    own machine and device for a run in one piece, and for a piece written before pieces named
    theirs."""
    device = where.get("execution", {}).get("device")
    pieces = where.get("pieces") or [{"wall_seconds": where["wall_seconds"]}]
    return [
        (piece["machine"], piece.get("device"), float(piece["wall_seconds"]))
        if "machine" in piece
        else (where["machine"], device, float(piece["wall_seconds"]))
        for piece in pieces
    ]


SMOKE_OPTIONS = ("max_rounds", "max_batch", "grid_limit")
"""Options of a reproduction's specification that make it a smoke run, never a result (it may
still be kept, to continue it: only :func:`record` refuses it)."""
SMOKE_OVERRIDES = ("scenario.test_limit",)
"""``--set`` keys that make it one too (every run evaluated on a subset of the test rows)."""


def refuse_smoke_run(out: Path, spec: dict[str, Any]) -> None:
    """Raise ValueError, naming the options, when the reproduction specified by ``spec`` (its
    ``sweep.json``) was a smoke run: its numbers are not a reproduction's."""
    found = [f"--{key.replace('_', '-')} {spec[key]}" for key in SMOKE_OPTIONS if spec.get(key) is not None]
    found += [
        f"--set {override}"
        for override in spec.get("overrides") or []
        if override.split("=", 1)[0].strip() in SMOKE_OVERRIDES
    ]
    if found:
        raise ValueError(f"{out} is a smoke run ({', '.join(found)}), not a reproduction to record")


def keep(out: Path, dest: Path) -> dict[str, Any]:
    """Copy into ``dest`` what ``fairclip reproduce --resume`` needs of the unfinished
    reproduction in ``out`` -- its ``sweep.json`` and the ``summary.json`` of every finished run
    (a run's summary is written last, so a run without one is in flight and is left out) -- and
    write ``progress.json``; return it. ``dest`` is replaced by the latest state (``out``'s
    reproduction may have been extended since, ``--extend``), but never with fewer finished runs
    or another specification: a ``dest`` that holds a run ``out`` has not finished, another
    reproduction (or more seeds or policies than ``out``'s), or anything but a kept reproduction,
    is refused (ValueError) and left as it is."""
    out, dest = Path(out), Path(dest)
    if not (out / "sweep.json").is_file():
        raise FileNotFoundError(f"{out} holds no sweep.json: it is not a reproduction folder")
    spec = canonical_spec(json.loads((out / "sweep.json").read_text()), quiet=True)
    if spec.get("command") != "reproduce":
        raise ValueError(f"{out} holds a {spec.get('command')!r} sweep, not a reproduction")
    finished = sorted((out / "runs").glob("*/summary.json"))
    if dest.is_dir() and any(dest.iterdir()) and not (dest / "sweep.json").is_file():
        raise ValueError(f"{dest} holds something other than a kept reproduction: it is not replaced")
    if (dest / "sweep.json").is_file():
        if not _continues(canonical_spec(json.loads((dest / "sweep.json").read_text()), quiet=True), spec):
            raise ValueError(
                f"{dest} keeps another reproduction than {out} (or more seeds or policies of it); "
                "delete it first to replace it"
            )
        kept = {path.parent.name for path in dest.glob("runs/*/summary.json")}
        dropped = sorted(kept - {path.parent.name for path in finished})
        if dropped:
            raise ValueError(
                f"{out} lacks {len(dropped)} finished run(s) that {dest} keeps ({', '.join(dropped)}): "
                f"copy them into {out} first (or delete {dest})"
            )
    summaries = [json.loads(path.read_text()) for path in finished]
    entry = {
        "setup": spec.get("name"),
        "specification": spec,
        "finished_runs": len(finished),
        **_runs_provenance(summaries),
        "kept": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if dest.exists():
        shutil.rmtree(dest)
    for path in finished:
        (dest / "runs" / path.parent.name).mkdir(parents=True)
        shutil.copyfile(path, dest / "runs" / path.parent.name / "summary.json")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "sweep.json", dest / "sweep.json")
    write_json(dest / "progress.json", entry)
    return entry


def _continues(kept: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Whether the reproduction ``spec`` is the kept one ``kept``, or that one extended
    (``fairclip reproduce --extend``: more seeds or policies, nothing else changed)."""

    if kept == spec:
        return True
    try:
        return merge_specs(kept, spec) == spec
    except (ConfigError, KeyError):  # another setup, grid or option; a specification without seeds
        return False


def _number(value: Any, digits: int = 4) -> str:
    """A table cell: a number to ``digits`` places, "—" for none, other text as it is."""
    if value == "" or value is None:
        return "—"
    try:
        return f"{float(value):.{digits}f}"
    except ValueError:
        return str(value)


def setup_markdown(folder: Path) -> str:
    """One recorded setup: its title line, how it was run, and its table."""
    entry = json.loads((folder / "record.json").read_text())
    table = read_table(folder / "reproduction.csv", keep_default_na=False)
    machines = entry.get("machines") or [{"machine": entry["machine"]}]
    minutes = f"{entry['compute_seconds'] / 60:.0f} min of run time"
    if len(machines) == 1:
        where = f"{minutes}, {machines[0]['machine'].get('cores')} CPU core(s) per run"
    else:
        where = f"{minutes}: " + "; ".join(_machines_text(machines))
    lines = [
        f"**{entry['setup']}** ({entry['seeds']} seeds, {entry['runs']} runs, {where}, "
        f"recorded at commit {str(entry['recorded_at_commit'])[:7]}): `{entry['command']}`",
        "",
        "| policy | ε (RDP / PRV) | metric | paper | fairclip (mean ± s.e.) | |",
        "|---|---|---|---:|---:|---|",
    ]
    paper_values = table["paper"].astype(str) != ""
    for _, row in table.iterrows():
        error = row["fairclip_stderr"]
        mean = _number(row["fairclip_mean"]) + ("" if error == "" else f" ± {float(error):.4f}")
        outside = str(row["outside"]) == "True"
        lines.append(
            f"| `{row['policy']}` | {row['epsilon_rdp']} / {row['epsilon_prv']} | {row['metric']} | "
            f"{_number(row['paper'])} | {mean} | {'outside' if outside else ''} |"
        )
    if not paper_values.any():
        lines += ["", "The paper gives no values for this setup."]
    lines += ["", f"Report with the notes and flags: [{folder.name}/reproduction.md]({_link(folder)})."]
    return "\n".join(lines)


def _machines_text(machines: list[dict[str, Any]]) -> list[str]:
    """Each machine of a record's ``machines``: its runs, their time, its cores, GPU and device;
    with its platform too where another entry has the same cores, GPU and device (two hosts of
    one kind, say), so that two entries never read as one machine named twice."""
    places = [_place(entry) for entry in machines]
    texts = []
    for entry, place in zip(machines, places, strict=True):
        if places.count(place) > 1:
            place = _place(entry, platform=True)
        runs = f"{entry['runs']} run{'' if entry['runs'] == 1 else 's'}"
        texts.append(f"{runs} ({entry['seconds'] / 60:.0f} min) on {place}")
    return texts


def _place(entry: dict[str, Any], platform: bool = False) -> str:
    """Where one entry of a record's ``machines`` ran: its cores, their CPU model and torch's
    CPU kernels (where recorded, since 2026-12-07), GPU (and ``platform``) and training device."""
    machine = entry["machine"]
    parts = (machine.get("cpu"), machine.get("cpu_capability"), machine.get("platform") if platform else None)
    named = [str(part) for part in parts if part]
    host = f" ({', '.join(named)})" if named else ""
    gpu = f" with an {machine['gpu']}" if machine.get("gpu") else ""
    device = f", trained on {entry['device']}" if entry["device"] else " (training device not recorded)"
    return f"{machine.get('cores')} CPU core(s){host}{gpu}{device}"


def refresh_notes(folder: Path) -> bool:
    """Rewrite the notes line of the recorded report in ``folder`` from its setup file's current
    notes (where a flag's likely cause is added after the runs); whether it changed. The numbers
    and every other line stay as recorded."""

    report = Path(folder) / "reproduction.md"
    if not report.is_file():
        raise FileNotFoundError(f"{folder} holds no reproduction.md: nothing is recorded there")
    setup = load_setup(json.loads((Path(folder) / "record.json").read_text())["setup"])
    lines = report.read_text().split("\n")
    found = [index for index, line in enumerate(lines) if line.startswith("Notes: ")]
    if len(found) != 1:
        raise ValueError(f"{report} has {len(found)} notes lines where one is expected")
    fresh = notes_line(setup)
    if lines[found[0]] == fresh:
        return False
    lines[found[0]] = fresh
    atomic_write_text(report, "\n".join(lines))
    return True


def retabulate(folder: Path) -> bool:
    """Tabulate the recorded reproduction in ``folder`` again from its recorded per-seed values
    (``per_seed.csv``), under its setup file's current paper values, paired metrics and claims:
    the paired metrics' table rows and per-seed columns, every row's paper value, error and flag,
    ``claims.csv``, ``fairest.csv`` and the report; the means and errors of the runs' own rows,
    their paired tests, the notes' place, the report's other lines and its wall time stay as
    recorded. Whether anything changed. A setup with a grid is refused (its chosen
    points are not recorded: rerun it), as is a record without per-seed values."""
    folder = Path(folder)
    setup = load_setup(json.loads((folder / "record.json").read_text())["setup"])
    if setup.has_grid:
        raise ValueError(f"{setup.name} has a grid, whose chosen points its record lacks: rerun it instead")
    if not (folder / "per_seed.csv").is_file():
        raise FileNotFoundError(f"{folder} holds no per_seed.csv: its per-seed values were not recorded")
    paired = {metric.name for metric in setup.paired_metrics}
    as_written = {"keep_default_na": False, "dtype": {"target_epsilon": str}}  # "" stays "", ε stays text
    per_seed = read_table(folder / "per_seed.csv", **as_written)
    per_seed = per_seed.drop(columns=[column for column in per_seed.columns if column in paired])
    reference = reference_policy(setup)
    per_seed_rows = add_paired_metrics(setup.paired_metrics, reference, per_seed.to_dict("records"))
    recorded = read_table(folder / "reproduction.csv", keep_default_na=False).to_dict("records")
    rows = [row for row in recorded if row["metric"] not in paired]
    table = pd.DataFrame(per_seed_rows)
    policies = {policy.name: policy for policy in setup.policies}
    with_paired: list[dict[str, Any]] = []
    for (policy, shown), group in groupby(rows, key=lambda row: (row["policy"], row["epsilon"])):
        text = target_texts(setup, shown)[0]  # a non-private policy: its first target
        own = [_recorded_row(row, policies[policy], text) for row in group]
        # each policy's paired rows follow its own rows at that ε
        with_paired += [*own, *paired_metric_rows(setup, policies[policy], text, table, own[0])]
    tested = folder / "paired_tests.csv"
    tests = read_table(tested, **as_written).to_dict("records") if tested.is_file() else []
    report = (folder / "reproduction.md").read_text().split("\n")
    notes = next(index for index, line in enumerate(report) if line.startswith("Notes: "))
    wall = next(index for index, line in enumerate(report) if line.startswith("Wall time: "))
    names = [name for name in (*FILES, *OPTIONAL_FILES) if (folder / name).is_file()]
    before = {name: (folder / name).read_bytes() for name in names}
    seconds = float(report[wall].removeprefix("Wall time: ").removesuffix(" s."))
    write_outputs(folder, setup, with_paired, seconds, report[notes + 1 : wall - 1], tests, per_seed_rows)
    return any((folder / name).read_bytes() != before.get(name) for name in (*FILES, *OPTIONAL_FILES))


def _recorded_row(row: dict[str, Any], policy: PolicySetup, epsilon: str) -> dict[str, Any]:
    """A row of a recorded ``reproduction.csv`` as :func:`table_rows` gives it (no grid point),
    with the paper's number, its standard error and the flag as the setup file now gives them;
    fairclip's mean and standard error stay as recorded. A row whose runs claim no ε shows none
    under either accountant (:func:`fairclip.sims.reproduce.tables.both_accountants`; records
    before 2026-12-05 showed what the mechanism alone would give there)."""
    stderr = "" if row["fairclip_stderr"] == "" else float(row["fairclip_stderr"])
    mean = float(row["fairclip_mean"])
    against = paper_columns(policy, epsilon, row["metric"], mean, math.nan if stderr == "" else stderr)
    claimed = {} if str(row["epsilon"]) != "inf" else {"epsilon_rdp": "inf", "epsilon_prv": "inf"}
    return {**row, **claimed, "fairclip_stderr": stderr, **against, "grid_point": {}}


def _link(folder: Path) -> str:
    try:
        return str(folder.resolve().relative_to(REPOSITORY) / "reproduction.md")
    except ValueError:
        return str(folder / "reproduction.md")


def results_markdown(results: Path = RESULTS_DIR) -> str:
    """Every recorded setup under ``results``, in name order, as markdown (the site's page)."""
    if not Path(results).is_dir():  # an installed copy holds no results folder
        return "No reproduction has been recorded yet."
    folders = sorted(p for p in Path(results).iterdir() if (p / "record.json").is_file())
    if not folders:
        return "No reproduction has been recorded yet."
    return "\n\n".join(setup_markdown(folder) for folder in folders)


def agreement(folder: Path) -> dict[str, int]:
    """How the recorded means of ``folder`` compare with the paper's numbers: how many have a paper
    value (``published``), of those how many a paper standard error too (``with_stderr``), and
    how many lie within ± 2 combined standard errors (where both sides have one) and within ± 2
    points. A record tabulated before ``paper_stderr`` was a column takes the setup file's. A
    number the setup repeats from ``setup.paper_values_from`` (the same policy, metric and value
    there) is counted with that setup, not again here."""

    table = read_table(folder / "reproduction.csv", keep_default_na=False)
    setup = load_setup(json.loads((folder / "record.json").read_text())["setup"])
    errors = {s.name: s.paper_stderr for s in setup.policies}
    repeated = {}
    if setup.paper_values_from is not None:
        repeated = {s.name: s.paper for s in load_setup(setup.paper_values_from).policies}
    counts = {"published": 0, "with_stderr": 0, "within_combined": 0, "within_points": 0}
    for _, row in table[table["paper"].astype(str) != ""].iterrows():
        paper, mean = float(row["paper"]), float(row["fairclip_mean"])
        # a non-private row's ε is inf where its paper value is filed under the setup's ε
        if paper in {values.get(row["metric"]) for values in repeated.get(row["policy"], {}).values()}:
            continue  # counted with the setup it repeats
        if "paper_stderr" in table.columns:  # empty: the paper gives none for this number
            paper_se = float(row["paper_stderr"]) if str(row["paper_stderr"]) != "" else None
        else:
            text = "" if setup.epsilons == [None] else f"{float(row['epsilon']):g}"
            paper_se = errors.get(row["policy"], {}).get(text, {}).get(row["metric"])
        se = float(row["fairclip_stderr"]) if str(row["fairclip_stderr"]) != "" else float("nan")
        counts["published"] += 1
        counts["with_stderr"] += paper_se is not None
        if paper_se is not None and se == se:
            counts["within_combined"] += abs(mean - paper) <= tolerance(paper_se, se)
        counts["within_points"] += abs(mean - paper) <= POINTS
    return counts


def claims_page(results: Path = RESULTS_DIR) -> str:
    """``docs/claims.md``: every claim of the five papers with fairclip's verdict, the fairest
    policy of each setup at each target ε, and how the recorded numbers agree with the papers'.
    A claim that its setup's record did not test (a setup recorded before its claims were
    written down, or a claim added since) is listed as pending, with the paper's figures."""

    folders = {p.name: p for p in Path(results).iterdir() if (p / "record.json").is_file()}
    tested: list[dict[str, Any]] = []
    pending: list[str] = []
    fairest: list[dict[str, Any]] = []
    totals = {"published": 0, "with_stderr": 0, "within_combined": 0, "within_points": 0}
    for name in builtin_setups():
        setup = load_setup(name)
        folder = folders.get(name)
        recorded: set[str] = set()
        if folder is not None and (folder / "claims.csv").is_file():
            rows = read_table(folder / "claims.csv", keep_default_na=False).to_dict("records")
            tested += rows
            recorded = {str(row["id"]) for row in rows}
        pending += [  # a claim its record lacks (written down after the runs) waits for a rerun
            f"| {name} | {c.claim} ({c.source}; `{c.first.label()}` − `{c.second.label()}`) | {c.paper} |"
            for c in setup.claims
            if c.id not in recorded
        ]
        if folder is not None and (folder / "fairest.csv").is_file():
            fairest += read_table(folder / "fairest.csv", keep_default_na=False).to_dict("records")
        if folder is not None:
            for key, value in agreement(folder).items():
                totals[key] += value
    verdicts = pd.Series([row["verdict"] for row in tested], dtype=object).value_counts().to_dict()
    tally = ", ".join(f"{count} {verdict}" for verdict, count in sorted(verdicts.items())) or "none"
    lines = [
        "# The papers' claims, tested",
        "",
        "Generated by `python -m tools.results claims` from the recorded reproductions "
        "(`results/reproductions/`); do not edit by hand.",
        "",
        "Each claim of the five papers that a reproduction can test is a difference first − second "
        "of two quantities measured on the same seeds (a seed fixes the data, the partition and the "
        "sampling). Its verdict is the two-sided paired t-test of a zero mean difference: **holds** "
        "where p < 0.05 with the sign the paper claims, **reverses** where p < 0.05 with the other "
        "sign, **inconclusive** otherwise.",
        "",
        f"Tested: {len(tested)} claims ({tally}); pending a rerun: {len(pending)}.",
        "",
        *claims_markdown(tested),
        "",
    ]
    if pending:
        lines += [
            "## Claims pending a rerun",
            "",
            "These setups were recorded before their claims were written down, or are being rerun "
            "as their papers ran them; their runs' per-seed values are not recorded yet.",
            "",
            "| setup | claim | paper |",
            "|---|---|---|",
            *pending,
            "",
        ]
    lines += [
        "## Which policy makes its worst group pay least",
        "",
        "The question fairclip exists to answer: per setup and target ε, the policies ranked by their "
        "worst-group privacy cost, max over cohorts of the accuracy lost against the non-private "
        "reference of the same seed (mean over seeds, 95 % t interval; p tests rank 1 against rank 2 "
        "on the same seeds). Only policies that spend about the same ε are ranked: one that spends "
        f"more than {COMPARABLE_EPSILON:g} times the least ε at its target, or claims none, is listed "
        "unranked.",
        "",
    ]
    for name in sorted({row["setup"] for row in fairest}):
        lines += [f"**{name}**", "", *fairest_markdown([r for r in fairest if r["setup"] == name]), ""]
    if not fairest:
        lines += ["No recorded setup has its per-seed values yet.", ""]
    lines += [
        "## Agreement with the papers' numbers",
        "",
        f"Of {totals['published']} published numbers with a fairclip counterpart, "
        f"{totals['with_stderr']} have the paper's standard error; "
        f"{totals['within_combined']} lie within ± 2 combined standard errors (where both sides have "
        f"one) and {totals['within_points']} within ± 2 points.",
        "",
    ]
    return "\n".join(lines)


def write_claims_page(page: Path = CLAIMS_PAGE, results: Path = RESULTS_DIR) -> bool:
    """Write :func:`claims_page` to ``page``; whether it changed."""
    fresh = claims_page(results)
    if Path(page).is_file() and Path(page).read_text() == fresh:
        return False
    atomic_write_text(Path(page), fresh)
    return True


def main(argv: list[str]) -> int:
    """``record OUT NAME --command TEXT``, ``keep OUT NAME``, ``notes NAME``, ``retabulate NAME``
    or ``claims``; a folder that holds no reproduction (or no finished one, for ``record``) is one
    line on stderr and status 2."""
    try:
        return _main(argv)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _setup_folder(base: Path, name: str, out: Path | None = None) -> Path:
    """``base / name`` for a setup's ``name``, where the command line files the results of the
    reproduction in ``out`` (if given). A ValueError where ``name`` is a path (the results would
    land in a folder nested under ``base``) or, for ``out``, another setup's name than the one its
    ``sweep.json`` names (they would be read as that setup's)."""
    if not name or Path(name).name != name or name in {".", ".."}:
        raise ValueError(f"NAME {name!r} is not a setup's name (give its name, e.g. galli-mnist, not a path)")
    if out is not None and (Path(out) / "sweep.json").is_file():
        stored = json.loads((Path(out) / "sweep.json").read_text()).get("name")
        if stored is not None and stored != name:
            raise ValueError(f"{out} holds a reproduction of {stored}, not of {name}")
    return base / name


def _main(argv: list[str]) -> int:
    if argv[:1] == ["keep"] and len(argv) == 3:
        entry = keep(Path(argv[1]), _setup_folder(IN_PROGRESS_DIR, argv[2], Path(argv[1])))
        print(
            f"kept {entry['setup']}: {entry['finished_runs']} finished runs, "
            f"{entry['compute_seconds']:.0f} s of run time, in {IN_PROGRESS_DIR / argv[2]}"
        )
        return 0
    if argv[:1] == ["notes"] and len(argv) == 2:
        changed = refresh_notes(_setup_folder(RESULTS_DIR, argv[1]))
        print(f"{argv[1]}: notes {'refreshed' if changed else 'already current'}")
        return 0
    if argv[:1] == ["retabulate"] and len(argv) == 2:
        changed = retabulate(_setup_folder(RESULTS_DIR, argv[1]))
        print(f"{argv[1]}: {'tabulated again' if changed else 'already current'}")
        return 0
    if argv[:1] == ["claims"] and len(argv) == 1:
        print(f"{CLAIMS_PAGE} {'written' if write_claims_page() else 'already current'}")
        return 0
    if argv[:1] == ["record"] and len(argv) == 5 and argv[3] == "--command":
        entry = record(Path(argv[1]), _setup_folder(RESULTS_DIR, argv[2], Path(argv[1])), argv[4])
        print(
            f"recorded {entry['setup']}: {entry['runs']} runs, {entry['compute_seconds']:.0f} s of run time"
        )
        return 0
    print(
        "usage: python -m tools.results record OUT NAME --command TEXT | keep OUT NAME | notes NAME"
        " | retabulate NAME | claims",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
