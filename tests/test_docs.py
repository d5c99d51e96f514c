"""The documentation site: every code block of ``docs/`` runs as written, the generated reference
covers the code, and ``mkdocs build --strict`` passes.

A page's code blocks run in order in a fresh temporary folder, Python blocks in one namespace
(as a reader pastes them into one session), shell blocks with ``bash -e`` in the same folder
(plain ``fairclip`` command lines in this process, without seconds of imports each:
:func:`fairclip_commands`), and TOML blocks are parsed, and validated as complete scenarios where
they hold a ``[scenario]`` table. An HTML comment right before a block changes what happens to it
(``docs/about.md``):

* ``<!-- test: skip (REASON) -->``: not run; the reason is required;
* ``<!-- test: file PATH -->``: written to PATH in the page's folder instead of being run (a
  module, a scenario file), for the blocks after it;
* ``<!-- test: replace "OLD" "NEW" (REASON) -->``: run with OLD replaced by NEW (a shorter run of a
  long command, with the same outputs);
* ``<!-- test: exit N -->``: the shell block must end with exit status N (an error it shows);
* ``<!-- test: needs-data FILE -->``: run only where ``FAIRCLIP_DATA`` holds FILE (a real data set);
* ``<!-- test: in-repo -->``: run in the repository's root (a read-only example of the repository).

Blocks of other languages (``text``: output) are not run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RUNNABLE = {"python", "sh", "bash", "toml"}
NOT_RUN = {"text", "console", "pycon", "yaml", "json", "csv", "markdown", "md", "ini"}
DIRECTIVES = {"skip", "file", "replace", "exit", "needs-data", "in-repo"}
BLOCK_TIMEOUT = 900


def _hooks():
    """``docs/hooks.py``, the generator of the site's reference pages, imported by path."""
    spec = importlib.util.spec_from_file_location("fairclip_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    directives: list[tuple[str, str]] = field(default_factory=list)

    def directive(self, name: str) -> str | None:
        return next((argument for key, argument in self.directives if key == name), None)

    @property
    def where(self) -> str:
        page = self.page.relative_to(REPO) if self.page.is_relative_to(REPO) else self.page
        return f"{page}:{self.line}"


_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^\s`]*)")
_SNIPPET = re.compile(r"^--8<--\n(?P<path>[^\n]+)\n--8<--$", re.MULTILINE)
"""A file of the repository shown whole in a block (``pymdownx.snippets``' block form, which ruff's
Markdown formatter leaves alone as it does not parse as Python): tested as it is shown."""
_CONTAINER = re.compile(r"^\s*(\?\?\?\+?|!!!|===)\s")
"""The head line of a collapsible box, an admonition or a tab, whose block is indented below it."""
_COMMENT = re.compile(r"^\s*<!--\s*test:\s*(?P<name>[a-z-]+)\s*(?P<argument>.*?)\s*-->\s*$")


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page`` with the test directives written right before each."""
    lines = page.read_text().split("\n")
    found: list[Block] = []
    pending: list[tuple[str, str]] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        comment = _COMMENT.match(line)
        fence = _FENCE.match(line)
        if comment:
            pending.append((comment["name"], comment["argument"]))
        elif fence:
            indent, marker = fence["indent"], fence["fence"]
            body = []
            index += 1
            while index < len(lines) and not lines[index].strip().startswith(marker):
                body.append(lines[index][len(indent) :] if lines[index].startswith(indent) else lines[index])
                index += 1
            language = fence["info"].split("{")[0].lower()
            code = _SNIPPET.sub(
                lambda match: (REPO / match["path"].strip()).read_text().rstrip("\n"), "\n".join(body)
            )
            found.append(Block(page, index - len(body), language, code + "\n", pending))
            pending = []
        elif line.strip() and not _CONTAINER.match(line):
            pending = []  # a directive belongs to the block right after it (or in the box after it)
        index += 1
    return found


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def all_blocks() -> Iterator[Block]:
    for page in pages():
        yield from blocks(page)


def _runs(block: Block) -> bool:
    return block.language in RUNNABLE and block.directive("skip") is None


def _page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


def _pages_with_code() -> list[Path]:
    return [page for page in pages() if any(_runs(block) for block in blocks(page))]


_REPLACE = re.compile(r'^"(?P<old>[^"]+)" "(?P<new>[^"]*)" \((?P<reason>.+)\)$')


def _replaced(code: str, argument: str) -> str:
    match = _REPLACE.match(argument)
    assert match, f'replace: give "OLD" "NEW" (REASON), not {argument!r}'
    old, new = match["old"], match["new"]
    assert old in code, f"replace: {old!r} is not in the block"
    return code.replace(old, new)


def _is_scenario(document: dict) -> bool:
    return isinstance(document.get("scenario"), dict)


def check_toml(block: Block, text: str) -> None:
    """A TOML block parses; a complete scenario (a ``[scenario]`` table) also validates."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise AssertionError(f"{block.where}: TOML does not parse: {error}") from None
    if _is_scenario(document):
        _hooks().validate(document)


def _environment(folder: Path) -> dict[str, str]:
    environment = dict(os.environ)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment.get('PATH', '')}"
    environment["FLWR_TELEMETRY_ENABLED"] = "0"
    environment["MPLBACKEND"] = "Agg"
    return environment


_COMMAND = re.compile(r"^(?P<how>python -m fairclip|fairclip) (?P<args>[^$|;&<>`*?~(){}]+)$")
_IN_A_SHELL = (" compare", "--executor ray", "--backend ray", " flower", " bench")
"""Commands that start Ray or Flower run in a shell of their own, which leaves nothing behind."""


def fairclip_commands(code: str) -> list[tuple[str, str, list[str]]] | None:
    """A shell block of plain ``fairclip`` command lines, as (how, line, arguments), ``how`` being
    ``fairclip`` or ``python -m fairclip`` to run in this process, where torch and the rest are
    imported already (a command then costs its work, not seconds of imports), or ``bash`` for a
    command that starts Ray or Flower; None where the block needs a shell."""
    commands = []
    for line in re.sub(r"\s*\\\n\s*", " ", code).split("\n"):
        line = re.sub(r"\s+#.*$", "", line).strip()
        if not line or line.startswith("#"):
            continue
        match = _COMMAND.match(line)
        if match is None:
            return None
        how = "bash" if any(word in f" {line}" for word in _IN_A_SHELL) else match["how"]
        commands.append((how, line, shlex.split(match["args"])))
    return commands or None


def run_commands(commands: list[tuple[str, str, list[str]]], folder: Path) -> tuple[int, str]:
    """Run the commands as ``bash -e`` would, up to the first that fails: with ``fairclip``'s own
    entry point in this process (the console script ``fairclip`` without the current folder on
    Python's path, ``python -m fairclip`` with it, as in a shell), or in ``bash``. Returns the
    exit status and the output."""
    from fairclip.__main__ import main

    output = io.StringIO()
    for how, line, argv in commands:
        if how == "bash":
            done = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", line],
                cwd=folder,
                env=_environment(folder),
                capture_output=True,
                text=True,
                timeout=BLOCK_TIMEOUT,
            )
            output.write(done.stdout + done.stderr)
            if done.returncode != 0:
                return done.returncode, output.getvalue()
            continue
        path, hidden = list(sys.path), {}
        if how == "fairclip":
            sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != folder.resolve()]
            for name, module in list(sys.modules.items()):
                if (getattr(module, "__file__", None) or "").startswith(str(folder)):
                    hidden[name] = sys.modules.pop(name)
        else:
            sys.path.insert(0, str(folder))
        status = 0
        try:
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                main(argv)
        except SystemExit as done:
            status = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        finally:
            sys.path[:] = path
            sys.modules.update(hidden)
        if status != 0:
            return status, output.getvalue()
    return 0, output.getvalue()


def run_page(page: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Run every block of ``page`` in ``folder``; returns how many ran and how many were skipped."""
    counts = {"ran": 0, "skipped": 0}
    module = types.ModuleType("__docs__")  # the page's session, a module as a script's would be
    namespace = module.__dict__
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    sys.modules["__docs__"] = module  # dataclasses and pickle look a class's module up
    try:
        for block in blocks(page):
            if block.language not in RUNNABLE:
                continue
            if block.directive("skip") is not None:
                counts["skipped"] += 1
                continue
            data = block.directive("needs-data")
            if data is not None:
                root = os.environ.get("FAIRCLIP_DATA")
                if not root or not (Path(root) / data).exists():
                    counts["skipped"] += 1  # as the suite's tests of real data: skipped where absent
                    continue
            code = block.code
            for key, argument in block.directives:
                if key == "replace":
                    code = _replaced(code, argument)
            target = block.directive("file")
            if target is not None:
                path = folder / target
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(code)
                if block.language == "toml":
                    check_toml(block, code)
                counts["ran"] += 1
                continue
            if block.language == "python":
                exec(compile(code, block.where, "exec"), namespace)  # the docs' own code
            elif block.language == "toml":
                check_toml(block, code)
            elif block.directive("in-repo") is None and (commands := fairclip_commands(code)):
                monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
                monkeypatch.setenv("MPLBACKEND", "Agg")
                status, output = run_commands(commands, folder)
                expected = int(block.directive("exit") or 0)
                assert status == expected, (
                    f"{block.where}: exit status {status}, expected {expected}\n{output[-3000:]}"
                )
            else:
                where = REPO if block.directive("in-repo") is not None else folder
                done = subprocess.run(
                    ["bash", "-e", "-o", "pipefail", "-c", code],
                    cwd=where,
                    env=_environment(folder),
                    capture_output=True,
                    text=True,
                    timeout=BLOCK_TIMEOUT,
                )
                expected = int(block.directive("exit") or 0)
                assert done.returncode == expected, (
                    f"{block.where}: exit status {done.returncode}, expected {expected}\n"
                    f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
                )
            counts["ran"] += 1
    finally:
        sys.modules.pop("__docs__", None)
        for name in set(sys.modules) - before:  # the page's own modules (my_data, my_research)
            module_file = getattr(sys.modules[name], "__file__", None) or ""
            if module_file.startswith(str(folder)):
                del sys.modules[name]
    return counts


# ---- the blocks themselves ------------------------------------------------------------------------


def test_every_block_says_what_it_is_and_every_skip_why() -> None:
    problems = []
    for block in all_blocks():
        if block.language not in RUNNABLE | NOT_RUN:
            problems.append(f"{block.where}: code block of language {block.language or '(none)'!r}")
        for name, argument in block.directives:
            if name not in DIRECTIVES:
                problems.append(f"{block.where}: unknown test directive {name!r}")
            if name in ("skip", "replace") and not re.search(r"\(.{10,}\)\s*$", argument):
                problems.append(f"{block.where}: {name} without a reason in parentheses")
            if name == "file" and (not argument or argument.startswith("/") or ".." in argument):
                problems.append(f"{block.where}: file needs a relative path inside the page's folder")
    assert not problems, "\n".join(problems)


def test_the_directives_are_found() -> None:
    """The parser sees a directive, the language and the code of a block, also inside a tab."""
    page = DOCS / "tutorials" / "own-policy.md"
    found = blocks(page)
    assert any(block.directive("file") == "my_research.py" for block in found)
    files = {block.directive("file"): block for block in found if block.directive("file")}
    assert files["my_research.py"].language == "python"
    assert "class LinearQuantile(Policy)" in files["my_research.py"].code
    indented = [block for block in found if block.language == "sh" and "compare" in block.code]
    assert indented and all(not block.code.startswith(" ") for block in indented)


def test_toml_blocks_parse() -> None:
    for block in all_blocks():
        if block.language == "toml":
            try:
                tomllib.loads(block.code)
            except tomllib.TOMLDecodeError as error:
                raise AssertionError(f"{block.where}: {error}") from None


def test_a_failing_block_fails_its_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner is not a stub: a wrong exit status, a failing Python block and an invalid
    scenario each fail the page."""
    page = tmp_path / "page.md"
    for number, (text, failure, message) in enumerate(
        [
            ("```sh\nexit 3\n```\n", AssertionError, "exit status 3, expected 0"),
            ("<!-- test: exit 2 -->\n```sh\ntrue\n```\n", AssertionError, "exit status 0, expected 2"),
            ("```python\nassert 1 == 2, 'wrong'\n```\n", AssertionError, "wrong"),
            ("```sh\nfairclip run --scenario no-such-scenario\n```\n", AssertionError, "expected 0"),
            (
                '```toml\n[scenario]\nname = "x"\ntask = "classification"\n```\n',
                ValueError,
                "required key is missing",
            ),
        ]
    ):
        page.write_text(text)
        folder = tmp_path / f"run-{number}"
        folder.mkdir()
        with pytest.raises(failure, match=message):
            run_page(page, folder, monkeypatch)
    page.write_text("<!-- test: skip (shown, not run: it would fail) -->\n```sh\nexit 1\n```\n")
    assert run_page(page, tmp_path, monkeypatch) == {"ran": 0, "skipped": 1}


def test_plain_fairclip_lines_run_in_this_process_and_the_rest_in_a_shell() -> None:
    block = "fairclip run --scenario demo \\\n  --out runs/x  # a note\npython -m fairclip scenarios\n"
    assert fairclip_commands(block + "fairclip compare --scenario demo\n") == [
        (
            "fairclip",
            "fairclip run --scenario demo --out runs/x",
            ["run", "--scenario", "demo", "--out", "runs/x"],
        ),
        ("python -m fairclip", "python -m fairclip scenarios", ["scenarios"]),
        ("bash", "fairclip compare --scenario demo", ["compare", "--scenario", "demo"]),
    ]
    for shell in ('fairclip data --data-dir "$FAIRCLIP_DATA"\n', "cp a b\n", block + "ls\n"):
        assert fairclip_commands(shell) is None, shell


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_code(), ids=_page_id)
def test_page_code_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = run_page(page, tmp_path, monkeypatch)
    assert counts["ran"] > 0


INTERNAL = re.compile(r"fairclip\.(sims|server|client|strategies|benchmarks)\b|\bsims/")
"""A module path inside the package: the pages name the public surface only (``fairclip``,
``fairclip.api``, ``policies``, ``flower``, ``plugins``, the ``fairclip`` command), so that moving a
module changes ``docs/hooks.py`` alone."""
OWN_TERMS = {
    "design.md": "the design document, for contributors, names the modules it designs",
    "claims.md": "written by the results tool, whose header names it",
}


def test_the_pages_name_only_the_public_surface() -> None:
    found = []
    for page in pages():
        if _page_id(page) in OWN_TERMS:
            continue
        for number, line in enumerate(page.read_text().split("\n"), 1):
            if INTERNAL.search(line):
                found.append(f"{page.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


# ---- the generated reference ----------------------------------------------------------------------


def test_every_configuration_key_has_type_default_and_meaning() -> None:
    hooks = _hooks()
    keys = hooks.configuration_keys()
    assert {
        "seed",
        "federation.num_clients",
        "privacy.target_epsilon",
        "policy.bounded.lower_bound",
    } <= set(keys)
    missing = [key for key, (_, _, meaning) in keys.items() if meaning == hooks.MISSING_MEANING]
    assert not missing, f"keys without a docstring or an entry in docs/hooks.py MEANINGS: {missing}"
    assert keys["policy.bounded.lower_bound"][1] == "required"
    assert keys["federation.sample_rate"][0] == "number > 0, ≤ 1"
    page = hooks.configuration_page()
    for key in keys:
        if not key.startswith("policy."):
            assert f"<code>{key}</code>" in page.replace("<wbr>", ""), key


def test_the_meanings_table_names_only_keys_that_exist() -> None:
    hooks = _hooks()
    keys = set(hooks.configuration_keys())
    models = {cls.__name__ for cls in _models(hooks)}
    stale = []
    for key in hooks.MEANINGS:
        model, _, name = key.partition(".")
        if model in models:
            if not any(name in cls.model_fields for cls in _models(hooks) if cls.__name__ == model):
                stale.append(key)
        elif key not in keys:
            stale.append(key)
    assert not stale, f"MEANINGS of keys no configuration model has: {stale}"


def _models(hooks) -> set[type]:
    from pydantic import BaseModel

    seen: set[type] = set()
    todo: list[type] = [hooks.RunConfig, *(policy.Params for policy in hooks.POLICIES.values())]
    while todo:
        model = todo.pop()
        for cls in model.__mro__:
            if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
                seen.add(cls)
        for info in model.model_fields.values():
            for nested, _ in hooks._nested_models(info.annotation):
                if nested not in seen:
                    todo.append(nested)
    return seen


def test_the_cli_page_has_every_command_and_option() -> None:
    import click
    import typer

    hooks = _hooks()
    page = hooks.cli_page()
    group = typer.main.get_command(hooks.cli_app)
    assert isinstance(group, click.Group)
    for name, command in group.commands.items():
        assert f"## `fairclip {name}`" in page
        for param in command.params:
            for option in param.opts:
                if option.startswith("-") and option != "--help":
                    assert f"`{option}`" in page, f"fairclip {name} {option}"


def test_the_policies_page_has_every_policy_with_its_equations() -> None:
    hooks = _hooks()
    page = hooks.policies_page()
    for name in hooks.POLICIES:
        assert f"## `{name}` {{#{name}}}" in page
    assert "C_{t+1} = max(C_LB, C_t · exp(η_C · (b̃ − γ)))" in page  # adaptive's rule, from its module
    prose = re.sub(r"```.*?```", "", page, flags=re.DOTALL)  # the text, not the code it shows
    assert "::" not in prose  # every reST literal block became a fenced block
    assert ":class:" not in prose and ":mod:" not in prose and "``" not in prose
    assert "class BoundedAdaptiveClipping(AdaptiveClipping)" in page  # each policy's code, folded


def test_rst_blocks_become_fenced_code_inside_and_outside_lists() -> None:
    hooks = _hooks()
    text = "Rule::\n\n    C = 1\n\n* item::\n\n      x = 2\n\n  more of the item\n\nAfter."
    assert hooks.rst_to_markdown(text).split("\n") == [
        "Rule:",
        "",
        "```text",
        "C = 1",
        "```",
        "",
        "* item:",
        "",
        "    ```text",
        "    x = 2",
        "    ```",
        "",
        "    more of the item",
        "",
        "After.",
    ]


def test_the_reproductions_pages_show_every_recorded_setup() -> None:
    hooks = _hooks()
    generated = hooks.reproduction_pages()
    recorded = sorted(
        p.name for p in (REPO / "results" / "reproductions").iterdir() if (p / "record.json").is_file()
    )
    assert recorded
    for setup in recorded:
        assert f"results/reproductions/{setup}.md" in generated
        assert f"(reproductions/{setup}.md)" in generated["results/reproductions.md"]
    assert "](results/" not in generated["results/reproductions.md"]


# ---- the site ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs and mkdocstrings are not installed (pip install -e '.[docs]')")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=_environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    site = tmp_path / "site"
    for page in ("index.html", "reference/configuration/index.html", "reference/cli/index.html",
                 "explanation/policies/index.html", "results/reproductions/index.html",
                 "reference/api/index.html"):  # fmt: skip
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text()
    assert "simulate" in api and "FederatedDataset" in api and ":class:" not in api


# ---- the output files page, against what the code writes --------------------------------------------

OUTPUTS = DOCS / "reference" / "outputs.md"


def _table_after(heading: str) -> list[list[str]]:
    """The cells of the first table after ``heading`` on the output files page."""
    text = OUTPUTS.read_text()
    assert heading in text, heading
    rows = []
    for line in text.split(heading, 1)[1].split("\n"):
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return rows[2:]  # past the head and the rule


def _names(cell: str) -> list[str]:
    return [name for span in re.findall(r"`([^`]+)`", cell) for name in span.split(", ")]


def _pattern(name: str) -> re.Pattern[str]:
    escaped = re.escape(name)
    for placeholder, matches in (("<cohort>", r"[^/]+"), ("<c>", r"\d+"), ("<k>", r"\d+"), ("<j>", r"\d+")):
        escaped = escaped.replace(re.escape(placeholder), matches)
    return re.compile(escaped + r"$")


def _documented(heading: str) -> list[tuple[re.Pattern[str], str]]:
    return [(_pattern(name), row[-1]) for row in _table_after(heading) for name in _names(row[0])]


def _dp_of(column: str, documented: list[tuple[re.Pattern[str], str]]) -> set[str]:
    return {dp for pattern, dp in documented if pattern.match(column)}


def _columns_in(heading: str, file: str) -> list[str]:
    """The columns the page lists for ``file`` (the first code span of its row's second cell)."""
    row = next(row for row in _table_after(heading) if f"`{file}`" in row[0])
    return re.findall(r"`([^`]+)`", row[1])[0].split(", ")


@pytest.mark.slow
def test_the_outputs_page_names_every_column_of_a_run_and_what_dp_covers() -> None:
    """Every column of ``rounds.csv`` that runs of every kind of policy and task write is on the
    page; the ones the executor keeps out of a public release are marked not covered by DP."""
    from fairclip.api import simulate_config

    hooks = _hooks()
    documented = _documented("### `rounds.csv`")
    keys = {name.split(".")[0] for row in _table_after("### `summary.json`") for name in _names(row[0])}
    runs = [("demo", name) for name in ("soft", "global-adapt", "per-cohort", "reweight", "online")]
    runs.append(("bimodal-mean", "bounded"))
    for scenario, policy in runs:
        raw = hooks.read_toml(hooks.builtin_scenarios()[scenario])
        raw["training"]["rounds"] = 2
        raw["policy"]["name"] = policy
        result = simulate_config(hooks.validate(raw))
        for column in result.rows[0]:
            found = _dp_of(column, documented)
            assert found, f"{scenario}/{policy}: rounds.csv column {column!r} is not on the page"
            if column not in result.public_columns:
                assert "no" in found, f"{column!r} is kept out of a public release but not marked 'no'"
            else:
                assert found - {"no"}, f"{scenario}: {column!r} is public; the page says DP does not cover it"
        assert set(result.summary) <= keys, f"summary.json keys not on the page: {set(result.summary) - keys}"


@pytest.mark.slow
def test_the_outputs_page_names_every_file_and_column_of_a_sweep(tmp_path: Path) -> None:
    import fairclip

    out = tmp_path / "sweep"
    fairclip.compare("demo", policies=["bounded"], epsilons=[4.0], overrides={"training.rounds": 2}, out=out)
    files = {name for row in _table_after("## A sweep (`fairclip compare`)") for name in _names(row[0])}
    for path in out.iterdir():
        shown = f"{path.name}/" if path.is_dir() else path.name
        assert shown in files or any(_pattern(name.rstrip("/")).match(path.name) for name in files), shown
    import pandas as pd

    summary = _documented("### `summary.csv`")
    for column in pd.read_csv(out / "summary.csv").columns:
        assert _dp_of(column, summary), f"summary.csv column {column!r} is not on the page"
    for file in ("statistics.csv", "paired_tests.csv"):
        header = list(pd.read_csv(out / file).columns)
        assert header == _columns_in("## A sweep (`fairclip compare`)", file), file


@pytest.mark.slow
def test_the_outputs_page_lists_the_columns_the_code_writes() -> None:
    """The columns of the files no quick run writes, from the code's own lists."""
    from fairclip.server.nodes import NODE_COLUMNS
    from fairclip.server.strategy import EVENT_COLUMNS
    from fairclip.sims.reproduce.claims import CLAIM_COLUMNS, FAIREST_COLUMNS
    from fairclip.sims.reproduce.tables import COLUMNS, PAIRED_COLUMNS
    from fairclip.sims.tune.curve import curve_public_columns

    reproduction = "## A reproduction (`fairclip reproduce`)"
    assert _columns_in(reproduction, "reproduction.csv") == COLUMNS
    assert _columns_in(reproduction, "claims.csv") == CLAIM_COLUMNS
    assert _columns_in(reproduction, "fairest.csv") == FAIREST_COLUMNS
    assert _columns_in("## A sweep (`fairclip compare`)", "paired_tests.csv") == PAIRED_COLUMNS
    assert _columns_in("the top of the curve's folder holds:", "curve.csv") == curve_public_columns(
        "<metric>"
    )
    deployment = "## A deployment (`ServerApp`)"
    assert _columns_in(deployment, "out/server-internal/replies.csv") == EVENT_COLUMNS
    assert _columns_in(deployment, "out/server-internal/nodes.csv") == NODE_COLUMNS
