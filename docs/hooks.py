"""The documentation site's generated pages: an mkdocs hook (``hooks:`` in ``mkdocs.yml``).

Each page below is written from the code at build time, so the site cannot drift from it:

* ``reference/configuration.md``: every configuration key with its type, default and meaning,
  from the pydantic models of a run's configuration and of each policy's ``Params``;
* ``reference/cli.md``: every command of ``fairclip`` with its options, from the typer app;
* ``reference/scenarios.md``: the built-in scenarios, from their TOML files;
* ``explanation/policies.md``: each built-in policy with its equations, sources, parameters and
  code, from the built-in policies' docstrings;
* ``results/reproductions.md`` and one page per recorded setup, from ``results/reproductions/``
  (rendered by tools.results.results_markdown).

The objects they are made from are imported in the four lines below, and nowhere else in
``docs/``: a module that moves (issue 66) changes one line here. ``RESULTS_TOOL`` is the one
command of the repository's results tool that pages show.
"""

from __future__ import annotations

import ast
import html
import inspect
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import typer
from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel

# The objects the generated pages document, one import line each: nothing else in docs/ imports
# them. tools/ (the repository's results tool) lives outside the package, beside docs/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# mkdocstrings finds packages by their folder's name, and fairclip's folder is the repository
# root, whatever the clone is called: .griffe/fairclip (ignored by git) holds links to the
# package's modules and subpackages only (the root also holds .venv, whose scan takes minutes).
_ROOT = Path(__file__).resolve().parents[1]
_GRIFFE = _ROOT / ".griffe" / "fairclip"
_GRIFFE.mkdir(parents=True, exist_ok=True)
for _entry in [*_ROOT.glob("*.py"), *(p.parent for p in _ROOT.glob("*/__init__.py"))]:
    if not (_GRIFFE / _entry.name).exists():
        (_GRIFFE / _entry.name).symlink_to(_entry, target_is_directory=_entry.is_dir())
from fairclip.cli import app as cli_app  # noqa: E402
from fairclip.policies import BUILTIN as POLICIES  # noqa: E402
from fairclip.scenarios.config import RunConfig, builtin_scenarios, read_toml, validate  # noqa: E402
from tools.results import RESULTS_DIR, results_markdown  # noqa: E402

RESULTS_TOOL = "python -m tools.results"
"""The repository's results tool (record, keep, notes, claims), as the pages show it: a page writes
``RESULTS_TOOL`` and the site shows this command, run from the repository's root."""

__all__ = ["POLICIES", "RESULTS_TOOL", "RunConfig", "cli_app", "generated_pages", "read_toml", "validate"]

MISSING_MEANING = "(no description)"

MEANINGS: dict[str, str] = {
    "seed": "Fixes the data, the partition, client sampling, local training and the DP noise of a "
    "simulation (a deployment's seed fixes the data partition only).",
    "scenario.name": "The scenario's name, used in run keys and reports.",
    "scenario.description": "One line shown by `fairclip scenarios`.",
    "scenario.task": "What the clients learn: `mean-estimation`, `classification` or "
    "`federated-dataset` (your own data); it decides which other `scenario` keys apply.",
    "scenario.dimension": "The dimension of each client's point.",
    "scenario.cohorts": "The cohorts, by name: each a table of its share of the clients and its data "
    "rule. The shares sum to 1.",
    "scenario.cohorts.*.share": "The cohort's share of the clients.",
    "scenario.cohorts.*.centre": "Where the cohort's points lie (one number, or one per dimension).",
    "scenario.cohorts.*.spread": "Standard deviation of the cohort's points around its centre.",
    "scenario.cohorts.*.synthetic.signal_feature": "The feature the cohort's label follows.",
    "scenario.cohorts.*.synthetic.signal_strength": "How strongly the label follows that feature.",
    "ClassificationSpec.dataset": "The data: `synthetic` (generated, no download) or a real dataset "
    "read from the data folder (`--data-dir`, `FAIRCLIP_DATA`) and checked against its SHA-256.",
    "FederatedDatasetSpec.dataset": "A `FederatedDataset`, or a loader `(num_clients, seed, **options) "
    "-> FederatedDataset`: a registered name, an entry point of `fairclip.datasets`, or "
    "`package.module:attribute`.",
    "scenario.options": "Keyword arguments of the dataset loader.",
    "scenario.dirichlet_alpha": 'α of the Dirichlet label skew (`partition = "dirichlet"`): '
    "smaller is more skewed.",
    "scenario.skew_class": "A class kept at a reduced share in the training data (skewed MNIST's 8).",
    "scenario.skew_keep": "The probability with which each training example of `skew_class` is kept.",
    "scenario.balance": "Adult: sample the same number of rows of each protected group "
    "(`balance_per_group`) instead of keeping all complete rows.",
    "federation.num_clients": "N, the population. Above 2²⁴ clients, sampling draws the sample's size "
    "and then a uniform subset, without touching every client.",
    "federation.sample_rate": "q, the probability with which each client joins a round (Poisson "
    "sampling); m̂ = qN is the public denominator of every round.",
    "training.rounds": "T, the number of rounds.",
    "training.local_epochs": "Passes over its data that a sampled client makes each round.",
    "training.batch_size": "A client's minibatch size.",
    "training.client_lr": "η_l, the clients' learning rate.",
    "training.server_lr": "η_s, the server's learning rate along the released update Δ̂.",
    "training.server_momentum": "Momentum of the server's SGD step (post-processing).",
    "training.server_beta1": 'β₁ of the server\'s Adam (`server_optimizer = "adam"` or `"adam-wosm"`).',
    "training.server_beta2": "β₂ of the server's Adam.",
    "training.server_eps": "ε of the server's Adam (numerical, not privacy).",
    "policy.name": "The clipping policy: a built-in name (below), or a plug-in reference (a "
    "registered name, an entry point of `fairclip.policies`, or `package.module:Class`). A Python "
    "`Scenario` starts from `none`, the non-private reference.",
    "privacy.noise_multiplier": "σ_Δ: the noise on the sum of clipped updates is N(0, (σ_Δ·s_t)²), "
    "s_t the round's sensitivity. 0 turns the noise off (ε is then infinite).",
    "privacy.count_noise_multiplier": "σ_b, the noise on the summed report vectors (counts, "
    "directions). Default: `count_noise_ratio`·σ_Δ.",
    "privacy.target_epsilon": "Calibrate σ_Δ (and σ_b = k·σ_Δ) so that `training.rounds` rounds spend "
    "this ε at `delta`. A scenario's own `noise_multiplier` is then replaced; one given with `--set` "
    "is refused, since it would go unused.",
    "privacy.epsilon_budget": "Stop before a round that would exceed this ε (default: the target).",
    "privacy.delta": "δ of every (ε, δ) claim.",
    "privacy.accountant": "`prv` (Opacus' PRV accountant, the default) or `rdp` (Rényi DP). PRV is "
    "refused beyond 100,000 rounds.",
    "PolicyParams.normalize": "Divide the noisy sum by m̂·s_t instead of m̂ (De et al. 2022), for "
    "every policy.",
}
"""Meanings of the keys whose model field has no docstring of its own (a field's docstring wins).
A key no model has any more fails ``tests/test_docs.py``, so this table cannot go stale."""


# ---- types, defaults and docstrings of pydantic models ----------------------------------------


def field_docstrings(model: type) -> dict[str, str]:
    """The docstrings written under each field of ``model`` and of its bases (``x: int = 1`` then
    a string), by field name: pydantic keeps them only with ``use_attribute_docstrings``."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls in (object, BaseModel) or not issubclass(cls, BaseModel):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, [*body[1:], None], strict=True):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[node.target.id] = inspect.cleandoc(after.value.value)
    return found


def _constraints(metadata: list[Any]) -> str:
    low = high = None
    length: list[str] = []
    finite = False
    for item in metadata:
        if isinstance(item, Gt):
            low = f"> {item.gt:g}"
        elif isinstance(item, Ge):
            low = f"≥ {item.ge:g}"
        elif isinstance(item, Lt):
            high = f"< {item.lt:g}"
        elif isinstance(item, Le):
            high = f"≤ {item.le:g}"
        elif isinstance(item, MinLen):
            length.append(f"at least {item.min_length}")
        elif isinstance(item, MaxLen):
            length.append(f"at most {item.max_length}")
        elif getattr(item, "allow_inf_nan", True) is False:
            finite = True
        for inner in getattr(item, "metadata", ()):  # a FieldInfo inside Annotated
            metadata.append(inner)
    parts = [p for p in (low, high) if p]
    text = ", ".join(parts)
    if len(length) == 2 and length[0].split()[-1] == length[1].split()[-1]:
        length = [f"exactly {length[0].split()[-1]}"]
    if length:
        text = ", ".join(filter(None, [text, " and ".join(length) + " items"]))
    if finite:
        text = ", ".join(filter(None, [text, "finite"]))
    return text


def type_text(annotation: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> str:
    """A reader's name of a field's type with its range: ``number > 0, finite``, ``one of `a`, `b```."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0], [*metadata, *args[1:]])
    if origin in (typing.Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        text = " or ".join(type_text(arg) for arg in kept)
        base = type_text(kept[0], metadata) if len(kept) == 1 else text
        return base + (", or unset" if len(kept) < len(args) else "")
    if origin is typing.Literal and len(args) == 1:
        return f"`{args[0]}`"
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in args)
    bounds = _constraints(list(metadata))
    if origin is list:
        inner = type_text(args[0]) if args else "values"
        text = f"list of {inner}"
        return f"{text} ({bounds})" if bounds else text
    if origin is dict and len(args) == 2 and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return "tables by name"
    if origin is dict:
        inner = type_text(args[1]) if len(args) > 1 else "values"
        return f"table of {inner}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    name = {bool: "boolean", int: "integer", float: "number", str: "string"}.get(annotation)
    if name is None:
        name = "any" if annotation is Any else getattr(annotation, "__name__", str(annotation))
    return f"{name} {bounds}".strip() if bounds and name in ("integer", "number") else name


def default_text(field: Any) -> str:
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, str):
        return f'`"{default}"`'
    if isinstance(default, dict) and not default:
        return "`{}`"
    return f"`{default!r}`" if not isinstance(default, float) else f"`{default:g}`"


def _cell(text: str) -> str:
    """Markdown of a docstring in one table cell: one line, reST literals as code."""
    text = " ".join(rst_to_markdown(inspect.cleandoc(text.strip())).split())
    return text.replace("|", "\\|")


def model_keys(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of every field of ``model`` under ``prefix``, nested tables
    expanded (``*`` for a table's names)."""
    docs = field_docstrings(model)
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        inherited = (MEANINGS.get(f"{cls.__name__}.{name}") for cls in model.__mro__)
        meaning = docs.get(name) or next(filter(None, inherited), None) or MEANINGS.get(key, MISSING_MEANING)
        yield key, type_text(field.annotation, field.metadata), default_text(field), _cell(meaning)
        for nested, below in _nested_models(field.annotation):
            yield from model_keys(nested, f"{key}{below}.")


def _nested_models(annotation: Any) -> Iterator[tuple[type[BaseModel], str]]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in args[:1] if origin is typing.Annotated else args:
            yield from _nested_models(arg)
    elif origin is dict and len(args) == 2:
        for nested, below in _nested_models(args[1]):
            yield nested, f".*{below}"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, ""


def _table(rows: list[tuple[str, ...]], head: tuple[str, ...]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _key_rows(rows: Iterator[tuple[str, str, str, str]]) -> list[tuple[str, ...]]:
    return [(key_code(key), kind, default, meaning) for key, kind, default, meaning in rows]


def key_code(key: str) -> str:
    """A key as code in a table cell that may break after a dot (``<wbr>``, which copies as
    nothing), so a long key wraps at its parts rather than pushing the meaning out of view."""
    return "<code>" + html.escape(key).replace(".", ".<wbr>") + "</code>"


KEY_HEAD = ("key", "type", "default", "meaning")


def configuration_keys() -> dict[str, tuple[str, str, str]]:
    """Every key of the configuration reference, with its type, default and meaning (the tests
    check that each has a meaning)."""
    found: dict[str, tuple[str, str, str]] = {}
    for section, model in _sections():
        prefix = "" if section == "seed" else f"{section}."
        if section == "seed":
            field = RunConfig.model_fields["seed"]
            found["seed"] = (
                type_text(field.annotation, field.metadata),
                default_text(field),
                _cell(MEANINGS["seed"]),
            )
            continue
        for key, kind, default, meaning in model_keys(model, prefix):
            found.setdefault(key, (kind, default, meaning))
    found["policy.name"] = ("string", "required", _cell(MEANINGS["policy.name"]))
    for name, policy in POLICIES.items():
        for key, kind, default, meaning in model_keys(policy.Params, f"policy.{name}."):
            found[key] = (kind, default, meaning)
    return found


def _sections() -> Iterator[tuple[str, Any]]:
    yield "seed", None
    for variant in typing.get_args(RunConfig.model_fields["scenario"].annotation):
        yield "scenario", variant
    for name in ("federation", "training", "privacy", "evaluation"):
        yield name, RunConfig.model_fields[name].annotation


def configuration_page() -> str:
    field = RunConfig.model_fields["seed"]
    parts = [
        "# Configuration keys",
        "",
        "Generated from the configuration model (`RunConfig`) and the policies' parameter schemas "
        "at build time. A scenario is a TOML file with a top-level `seed` and the tables "
        "`[scenario]`, `[federation]`, `[training]`, `[policy]`, `[privacy]` and `[evaluation]`; every "
        "key below can also be set with `--set KEY=VALUE` on the command line, with "
        "`overrides={KEY: value}` in Python, and in a Flower run's `--run-config`: directly where the "
        "app declares the key, otherwise in its `set='KEY=VALUE;...'`. An unknown key or "
        "a value out of range ends the command with one line naming it, and exit status 2, before "
        "any work starts.",
        "",
        "## Top level",
        "",
        _table(
            [
                (
                    key_code("seed"),
                    type_text(field.annotation, field.metadata),
                    default_text(field),
                    MEANINGS["seed"],
                )
            ],
            KEY_HEAD,
        ),
    ]
    titles = {
        "ScenarioSpec": '`[scenario]` of `task = "mean-estimation"`',
        "ClassificationSpec": '`[scenario]` of `task = "classification"`',
        "FederatedDatasetSpec": '`[scenario]` of `task = "federated-dataset"` (your own data)',
    }
    for section, model in _sections():
        if model is None:
            continue
        title = titles.get(model.__name__, f"`[{section}]`")
        lead = inspect.cleandoc(model.__doc__ or "") if section == "scenario" else ""
        if lead.startswith(("Configuration", "A base")):
            lead = ""
        parts += ["", f"## {title}", ""]
        if lead:
            parts += [_cell(lead), ""]
        parts.append(_table(_key_rows(model_keys(model, f"{section}.")), KEY_HEAD))
    parts += [
        "",
        "## `[policy]`",
        "",
        "`policy.name` chooses the policy. The policy's parameters go directly under `[policy]` "
        "(`policy.lower_bound`) or in a sub-table `[policy.<name>]`, which holds defaults for "
        "that one policy only, so a scenario can give `bounded` its lower bound and still run with "
        "`--set policy.name=constant`. A key directly under `[policy]` wins over the sub-table; a "
        "`--set policy.<name>.<key>` while `policy.<key>` is set directly would go unused, and "
        "is refused. `[strategy]` and `strategy.*`, the table's old name, are still read as "
        "`[policy]` and `policy.*` (with a note); giving both names is refused.",
        "",
        _table([(key_code("policy.name"), *configuration_keys()["policy.name"])], KEY_HEAD),
    ]
    for name, policy in POLICIES.items():
        rows = [
            (key_code(f"policy.{key.split('.', 2)[2]}"), kind, default, meaning)
            for key, kind, default, meaning in model_keys(policy.Params, f"policy.{name}.")
        ]
        parts += [
            "",
            f"### `{name}` {{#{name}}}",
            "",
            f"Parameters of [`{name}`](../explanation/policies.md#{name}) "
            f"(`policy.<key>` or `policy.{name}.<key>`):",
            "",
            _table(rows, KEY_HEAD),
        ]
    return "\n".join(parts) + "\n"


# ---- the command line -----------------------------------------------------------------------------


def _rich_to_markdown(text: str) -> str:
    """Typer's help text (rich markup, reST literals) as Markdown; a placeholder such as
    ``runs/<scenario>`` outside code kept as text, not read as an HTML tag."""
    text = text.replace("\\[", "[")
    parts = rst_to_markdown(text).split("`")
    return "`".join(part if odd else _escape_angles(part) for odd, part in zip_odd(parts))


def zip_odd(parts: list[str]) -> Iterator[tuple[bool, str]]:
    """Each part of a text split at backticks, with whether it lies inside a code span."""
    return ((index % 2 == 1, part) for index, part in enumerate(parts))


def _escape_angles(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _option_type(param: click.Parameter) -> str:
    kind = param.type
    if getattr(param, "is_flag", False):
        return "flag"
    if isinstance(kind, click.Choice):
        return "one of " + ", ".join(f"`{choice}`" for choice in kind.choices)
    if isinstance(kind, click.IntRange | click.FloatRange):
        low = "" if kind.min is None else f"{'>' if kind.min_open else '≥'} {kind.min}"
        high = "" if kind.max is None else f"{'<' if kind.max_open else '≤'} {kind.max}"
        name = "integer" if isinstance(kind, click.IntRange) else "number"
        return " ".join(filter(None, [name, ", ".join(filter(None, [low, high]))]))
    name = {"text": "text", "integer": "integer", "float": "number", "path": "path"}.get(kind.name, kind.name)
    if getattr(param, "multiple", False):
        name += ", repeatable"
    return name


def _option_default(param: click.Parameter) -> str:
    if param.required:
        return "required"
    default = param.default
    if getattr(param, "is_flag", False) and default is False:
        return ""
    if default is None or default == () or default == []:
        return ""
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{getattr(default, 'value', default)}`"


def cli_page() -> str:
    group = typer.main.get_command(cli_app)
    assert isinstance(group, click.Group)
    context = click.Context(group, info_name="fairclip")
    parts = [
        "# Command line",
        "",
        "Generated from the `fairclip` command's own definitions at build time; `fairclip COMMAND "
        "--help` prints the same. Every invalid input ends with one line on standard error naming "
        "the problem, and exit status 2; Ctrl-C and SIGTERM stop a command after writing what has "
        "finished (exit status 130 and 143); a file that cannot be written mid-run ends it with "
        "exit status 74.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    names = list(group.commands)
    for name in names:
        command = group.commands[name]
        short = _rich_to_markdown(command.get_short_help_str(limit=200))
        parts.append(f"| [`fairclip {name}`](#fairclip-{name}) | {short} |")
    for name in names:
        command = group.commands[name]
        sub = click.Context(command, info_name=name, parent=context)
        usage = " ".join(command.collect_usage_pieces(sub))
        parts += ["", f"## `fairclip {name}`", "", "```text", f"fairclip {name} {usage}", "```", ""]
        parts.append(_rich_to_markdown(inspect.cleandoc(command.help or "")))
        rows = []
        for param in command.params:
            if getattr(param, "hidden", False) or param.name == "help":
                continue
            names_text = ", ".join(f"`{opt}`" for opt in [*param.opts, *getattr(param, "secondary_opts", [])])
            if isinstance(param, click.Argument):
                names_text = f"`{param.human_readable_name.upper()}` (argument)"
            help_text = " ".join(_rich_to_markdown(getattr(param, "help", None) or "—").split())
            if getattr(param, "envvar", None):
                help_text += f" Environment: `{param.envvar}`."
            rows.append(
                (names_text, _option_type(param), _option_default(param), help_text.replace("|", "\\|"))
            )
        if rows:
            parts += ["", _table(rows, ("option", "type", "default", "meaning"))]
    return "\n".join(parts) + "\n"


# ---- scenarios ------------------------------------------------------------------------------------


def scenarios_page() -> str:
    rows = []
    for name, path in builtin_scenarios().items():
        raw = read_toml(path)
        config = validate(raw)
        scenario = config.scenario
        data = getattr(scenario, "dataset", None) or scenario.task
        cohorts = ", ".join(f"`{cohort}`" for cohort in getattr(scenario, "cohorts", {}) or {})
        rows.append(
            (
                f"`{name}`",
                _cell(scenario.description),
                f"`{data}`",
                f"`{getattr(scenario, 'model', '—')}`" if scenario.task != "mean-estimation" else "—",
                f"{config.federation.num_clients:,}",
                f"{config.federation.sample_rate:g}",
                f"{config.training.rounds:,}",
                f"`{config.policy.name}`",
                cohorts,
            )
        )
    head = ("scenario", "what it is", "data", "model", "clients N", "rate q", "rounds T", "policy", "cohorts")
    return (
        "# Built-in scenarios\n\n"
        "Generated from the scenario files that ship with fairclip (`fairclip scenarios` lists "
        "them). Each is a TOML file of the keys in [Configuration keys](configuration.md); "
        "`--set` changes any of them for one run, and `fairclip compare` sets the policy and the "
        "target ε itself. The real datasets are read from `--data-dir` or `FAIRCLIP_DATA` and checked "
        "against their SHA-256 first; see [Use the real datasets](../how-to/real-datasets.md).\n\n"
        + _table(rows, head)
        + "\n"
    )


# ---- the policies --------------------------------------------------------------------------------

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")


def rst_to_markdown(text: str) -> str:
    """The reST of fairclip's docstrings as Markdown: roles and ````literals```` as code, ``::``
    blocks and indented blocks as fenced code, list items' continuations indented for Markdown."""
    text = _ROLE.sub(lambda match: f"`{match.group(1)}`", text)
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    lines = text.split("\n")
    out: list[str] = []
    index = 0
    in_item = False
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        if re.match(r"^[*-] ", line):
            in_item = True
        elif not stripped:
            pass
        elif not line.startswith(" "):
            in_item = False
        previous_blank = not out or not out[-1].strip()
        indent = len(line) - len(line.lstrip())
        item_text = 2 if in_item else 0
        if stripped and indent > item_text and previous_blank:
            block = []
            while index < len(lines) and (not lines[index].strip() or _indent(lines[index]) > item_text):
                block.append(lines[index])
                index += 1
            while block and not block[-1].strip():
                block.pop()
            code = textwrap.dedent("\n".join(block))
            pad = "    " if in_item else ""
            out += [
                f"{pad}```text",
                *(f"{pad}{row}" if row else "" for row in code.split("\n")),
                f"{pad}```",
                "",
            ]
            continue
        if stripped == "::":
            index += 1
            continue
        if stripped.endswith("::"):
            line = line.rstrip()[:-1]
        if in_item and indent == 2:
            line = "    " + line.lstrip()
        out.append(line)
        index += 1
    return "\n".join(out)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _sentence(text: str) -> str:
    """A docstring's summary as a sentence: its first letter a capital."""
    return text[:1].upper() + text[1:]


def _source_path(obj: Any) -> str:
    path = Path(inspect.getfile(obj)).resolve()
    return "/".join(path.parts[-2:])


def policies_page() -> str:
    parts = [
        "# The policies",
        "",
        "Generated from the built-in policies' docstrings and parameter schemas at build "
        "time: each policy's equations and sources are those its module states, next to the code "
        "that computes them. Symbols: Δ_i is client i's update, Δ̄_i its contribution after the "
        "client transform, b_i its report, C_t the bound of round t, s_t the round's sensitivity, "
        "m̂ = qN the expected number of clients, b̃ the released noisy fraction of the reports; "
        "[One private round](round.md) walks through a round.",
        "",
        "| policy | in one line | needs cohorts |",
        "|---|---|---|",
    ]
    for name, policy in POLICIES.items():
        module = inspect.getmodule(policy)
        first = inspect.cleandoc(module.__doc__ or "").split("\n\n")[0]
        summary = _sentence(_cell(first.split(":", 1)[1] if ":" in first else first))
        cohorts = "yes" if policy.needs_cohorts else "no"
        parts.append(f"| [`{name}`](#{name}) | {summary} | {cohorts} |")
    for name, policy in POLICIES.items():
        module = inspect.getmodule(policy)
        doc = inspect.cleandoc(module.__doc__ or "")
        head, _, rest = doc.partition("\n\n")
        summary = head.split(":", 1)[1].strip() if ":" in head else head
        parts += [
            "",
            f"## `{name}` {{#{name}}}",
            "",
            f"**{_sentence(_cell(summary))}**",
            "",
            rst_to_markdown(rest),
            "",
            f"Parameters (`[policy]` or `[policy.{name}]`; "
            f"[all keys](../reference/configuration.md#{name})):",
            "",
        ]
        rows = _key_rows(model_keys(policy.Params, ""))
        parts.append(_table(rows, KEY_HEAD))
        source = textwrap.dedent(inspect.getsource(policy))
        parts += [
            "",
            f'??? note "Code: `{policy.__name__}` in `{_source_path(policy)}`"',
            "",
            textwrap.indent(f"```python\n{source.rstrip()}\n```", "    "),
        ]
    return "\n".join(parts) + "\n"


# ---- recorded results ----------------------------------------------------------------------------


def reproduction_pages() -> dict[str, str]:
    """``results/reproductions.md`` (every recorded setup's tables, its links pointed at the pages of the
    reports) and ``results/reproductions/<setup>.md`` (each recorded ``reproduction.md``)."""
    body = results_markdown(RESULTS_DIR)
    body = re.sub(r"\]\([^)]*?reproductions/([^/)]+)/reproduction\.md\)", r"](reproductions/\1.md)", body)
    pages = {
        "results/reproductions.md": "# Reproductions\n\n"
        "Generated at build time from the recorded results under `results/reproductions/`, by the "
        "function `tools.results.results_markdown`. "
        "Each setup reruns a seed paper's experiment as the sample-level special case of fairclip "
        "(every training example a client that takes one step); "
        "[Reproduce a paper](../how-to/reproduce-a-paper.md) says how, and each setup's report "
        "gives its notes and the likely cause of every flag. A value is flagged *outside* when it "
        "lies outside the paper's mean ± 2 combined standard errors (± 2 points where either side "
        "has none). The papers' qualitative claims, tested, are on [Claims](../claims.md).\n\n" + body + "\n",
    }
    if Path(RESULTS_DIR).is_dir():
        for folder in sorted(Path(RESULTS_DIR).iterdir()):
            report = folder / "reproduction.md"
            if report.is_file():
                pages[f"results/reproductions/{folder.name}.md"] = report.read_text()
    return pages


def generated_pages() -> dict[str, str]:
    """Every generated page, by its path under ``docs/``."""
    return {
        "reference/configuration.md": configuration_page(),
        "reference/cli.md": cli_page(),
        "reference/scenarios.md": scenarios_page(),
        "explanation/policies.md": policies_page(),
        **reproduction_pages(),
    }


# ---- the mkdocs hook ------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, content in generated_pages().items():
        files.append(File.generated(config, path, content=content))
    return files


_PUBLIC_NAME = re.compile(r"^::: fairclip\.(\w+)$", re.MULTILINE)


def public_object_path(name: str) -> str:
    """Where mkdocstrings finds ``fairclip.NAME``: the module that defines it (``fairclip`` exports
    some names lazily, which static analysis cannot follow), so pages name only the public path."""
    import importlib

    import fairclip

    obj = getattr(fairclip, name, None)
    if obj is None or isinstance(obj, types.ModuleType):  # a public module: found as it is
        importlib.import_module(f"fairclip.{name}")
        return f"fairclip.{name}"
    return f"{obj.__module__}.{obj.__qualname__}"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """``RESULTS_TOOL`` as its command; ``::: fairclip.NAME`` of a lazily exported name as the
    path that defines it."""
    markdown = markdown.replace("RESULTS_TOOL", RESULTS_TOOL)
    return _PUBLIC_NAME.sub(lambda match: f"::: {public_object_path(match[1])}", markdown)


_HTML_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>~?")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings rendered by mkdocstrings keep their reST roles and ``::``: drop both."""
    html = _HTML_ROLE.sub("<code>", html)
    return html.replace("::</p>", ":</p>")
