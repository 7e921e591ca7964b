"""Every command in the README and in docs/*.md still works as written (issue 27).

The README is an entrance and the rest lives in ``docs/``; this checks, with no stack and
running nothing, what a reader copies from those pages:

- **shell** (``sh`` blocks, indented command lines, commands in inline code): each
  ``shepherd ...`` parses with the real CLI (click's parser on ``shepherd.cli.main.app``: the
  command path, every option, the arguments and their types; ``[--opt X]`` is tried with and
  without, ``a|b`` as each); each ``make X`` names a target (and ``VAR=...`` a variable) of
  the Makefile; ``python bench/x.py --opt`` and ``python -m module --opt`` name a script or
  module that takes that option; ``curl`` names one of localplane's routes;
  ``docker compose --scale S=N`` a service of the compose file;
- **paths**: every repository path a block or inline code names exists;
- **python** blocks compile (top-level ``await`` allowed) and what they import from the
  project exists;
- **yaml** blocks parse; a whole job spec (``name``, ``trainer``, ``training``) passes
  ``validate_spec``, a fragment of one (only spec sections) does once laid over
  examples/quickstart.yaml, and a block headed ``# examples/<file>`` shows that file as it
  is; ``toml`` and ``json`` blocks parse (a json block may elide with ``...``); the search
  attributes a query block names exist;
- **links**: every relative link points at a file that exists, and ``#anchor`` at a heading.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import itertools
import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
IDS = [str(doc.relative_to(ROOT)) for doc in DOCS]

#: The repository's own top-level folders: a path under one of them must exist.
REPO_DIRS = ("activities", "bench", "docs", "examples", "localplane", "shepherd", "tests")
REPO_DIRS += ("workers", "workflows")
#: Packages whose imports and command-line options are checked against their source.
PROJECT = {"activities", "bench", "examples", "localplane", "shepherd", "workers", "workflows"}
SHELL = {"sh", "shell", "bash", "console"}
#: The first words of a line that is a command worth checking (after VAR=value prefixes).
COMMANDS = {"shepherd", "make", "python", "python3", "pytest", "curl", "docker"}


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence (1-based)
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Page:
    blocks: list[Block]
    prose: str  # the page with its fenced blocks blanked out (line numbers kept)


_FENCE = re.compile(r"^( *)(`{3,}|~{3,})\s*([\w+-]*)")


@functools.cache
def page(doc: Path) -> Page:
    lines = doc.read_text().splitlines()
    blocks: list[Block] = []
    prose: list[str] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        indent, fence = len(m[1]), m[2]
        close = re.compile(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [line[indent:] if not line[:indent].strip() else line for line in lines[i + 1 : j]]
        blocks.append(Block(doc, i + 1, m[3].lower(), "\n".join(body) + "\n"))
        prose.extend([""] * (min(j, len(lines) - 1) - i + 1))
        i = j + 1
    # Indented code blocks (docs/scale.md, docs/crash.md): command lines after a blank line.
    for n, line in enumerate(prose):
        after = n and (not prose[n - 1].strip() or _is_command(prose[n - 1]))
        if line.startswith("    ") and after and _is_command(line):
            blocks.append(Block(doc, n + 1, "sh", line.strip() + "\n"))
    return Page(blocks, "\n".join(prose))


def _program(word: str) -> str | None:
    """The program a command's first word runs (``.venv/bin/shepherd``: shepherd), if one of
    :data:`COMMANDS`; a folder (``shepherd/``) is none."""
    name = Path(word).name
    return name if name in COMMANDS and not word.endswith("/") else None


def _is_command(line: str) -> bool:
    words = line.split()
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words = words[1:]
    return bool(words) and _program(words[0]) is not None


def inline_code(doc: Path) -> Iterator[tuple[int, str]]:
    """The inline code spans of ``doc``'s prose (a span may wrap), whitespace normalised."""
    prose = page(doc).prose
    for m in re.finditer(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)", prose):
        yield prose.count("\n", 0, m.start()) + 1, " ".join(m[1].split())


# ------------------------------------------------------------------------------- commands


def command_lines(text: str) -> Iterator[str]:
    """The command lines of a shell block: continuations joined, and an ``# or: <command>``
    comment counted as a command of its own."""
    for line in text.replace("\\\n", " ").splitlines():
        yield line
        alternative = re.search(r"#\s*or:\s*(.+)$", line)
        if alternative:
            yield alternative[1]


def variants(line: str) -> list[list[str]]:
    """The commands a documented line stands for: ``[--opt X]`` given and left out, each
    alternative of ``a|b|c``, split at ``|``, ``&&`` and ``;``, without ``VAR=value``
    prefixes. Each starts with its program's name (``.venv/bin/`` dropped)."""
    optional = re.compile(r"\s*\[(--[^\[\]]*)\]")
    texts = {optional.sub(r" \1", line), optional.sub("", line)}
    found: list[list[str]] = []
    for text in sorted(texts):
        try:
            words = shlex.split(text, comments=True)
        except ValueError:
            continue  # not a shell line (a JSON answer shown in a comment ...)
        commands = [
            list(group)
            for sep, group in itertools.groupby(words, lambda w: w in {"|", "||", "&&", ";"})
            if not sep
        ]
        for command in commands:
            while command and re.match(r"^[A-Z_][A-Z0-9_]*=", command[0]):
                command = command[1:]
            program = _program(command[0]) if command else None
            if program is None:
                continue
            command = [program, *command[1:]]
            if ">" in command:
                command = command[: command.index(">")]
            choices = [
                w.split("|") if re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)+", w) else [w]
                for w in command
            ]
            found.extend(list(c) for c in itertools.product(*choices))
    return found


@functools.cache
def _cli() -> Any:
    import typer

    from shepherd.cli.main import app

    return typer.main.get_command(app)


def _rest(ctx: Any) -> list[str]:
    protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
    return [*protected, *ctx.args]


def parse_cli(args: list[str]) -> tuple[list[str], Any]:
    """``shepherd <args>`` parsed as the real CLI parses it, down to the command it names, and
    nothing run (no callback, no connection): the command's path and object. The parser's own
    error (an unknown command or option, a missing argument, a value of the wrong type, extra
    arguments) is raised as it would be."""
    ctx = _cli().make_context("shepherd", list(args))
    path: list[str] = []
    while hasattr(ctx.command, "resolve_command"):  # a group: on to its subcommand
        if not _rest(ctx) and getattr(ctx.command, "invoke_without_command", False):
            break  # a group that is a command of its own too (``shepherd queues``)
        name, command, rest = ctx.command.resolve_command(ctx, _rest(ctx))
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    assert not _rest(ctx), f"unexpected arguments {_rest(ctx)}"
    return path, ctx.command


def _options_of(command: Any) -> set[str]:
    return {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}


@functools.cache
def make_targets() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))
    variables = set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*[?:+]?=", text, re.M))
    return targets, variables


@functools.cache
def routes() -> list[tuple[str, re.Pattern[str]]]:
    """localplane's routes, as (method, path pattern), read from its app's decorators."""
    source = (ROOT / "localplane" / "app.py").read_text()
    prefixes = dict(re.findall(r"(\w+) = APIRouter\(prefix=\"([^\"]*)\"", source))
    found = []
    for router, method, path in re.findall(
        r"@(\w+)\.(get|post|put|patch|delete)\(\"([^\"]+)\"", source
    ):
        full = prefixes.get(router, "") + path
        pattern = re.sub(r"\\\{\w+(?::path)?\\\}", "[^/]+?", re.escape(full))
        found.append((method.upper(), re.compile(pattern)))
    return found


def _script_options(source: str, args: list[str]) -> list[str]:
    return [
        f"it has no option {a.split('=')[0]}"
        for a in args
        if a.startswith("--") and f'"{a.split("=")[0]}"' not in source
    ]


def check_command(words: list[str], *, inline: bool = False) -> list[str]:
    """What is wrong with one command as written (nothing: it works as written)."""
    program, args = words[0], words[1:]
    if program == "shepherd":
        try:
            parse_cli(args)
        except Exception as exc:
            # An inline mention may name a command without its arguments ("`shepherd logs`").
            if inline and type(exc).__name__ == "MissingParameter":
                return []
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            return [f"the CLI refuses it: {type(exc).__name__}: {message}"]
        return []
    if program == "make":
        targets, variables = make_targets()
        return [
            f"the Makefile has no {'variable' if '=' in a else 'target'} {a.split('=')[0]}"
            for a in args
            if not a.startswith("-")
            and (a.split("=")[0] not in variables if "=" in a else a not in targets)
        ]
    if program in {"python", "python3"}:
        if args[:1] == ["-m"]:
            if len(args) == 1:
                return []  # a mention ("runs it with `python -m`")
            module = args[1]
            spec = importlib.util.find_spec(module)
            if spec is None:
                return [f"no module {module}"]
            if module.split(".")[0] in PROJECT and spec.origin:
                return _script_options(Path(spec.origin).read_text(), args[2:])
            return []
        if args and args[0].endswith(".py"):
            script = ROOT / args[0]
            if not script.is_file():
                return [f"no script {args[0]}"]
            return _script_options(script.read_text(), args[1:])
        return []
    if program == "curl":
        url = next((a for a in args if re.match(r"(https?://)?(localhost|127\.0\.0\.1):", a)), None)
        if url is None:
            return []
        method = "POST" if {"-d", "--data"} & set(args) else "GET"
        for i, a in enumerate(args):
            if a.startswith("-X"):
                method = (a[2:] or args[i + 1]).upper()
        path = urlsplit(url if "://" in url else f"http://{url}").path
        if not any(m == method and p.fullmatch(path) for m, p in routes()):
            return [f"localplane has no route {method} {path}"]
        return []
    if program == "docker" and "--scale" in args:
        services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
        service = args[args.index("--scale") + 1].split("=")[0]
        return [] if service in services else [f"docker-compose.yml has no service {service}"]
    return []


# ---------------------------------------------------------------------------------- paths

_PATH = re.compile(rf"(?<![\w./$-])((?:{'|'.join(REPO_DIRS)})/[\w./<>*{{}}-]*)")


def missing_paths(text: str) -> list[str]:
    """The repository paths ``text`` names that do not exist (outputs and patterns aside)."""
    text = text.replace("$PWD/", "")
    missing = []
    for m in _PATH.finditer(text):
        path = m[1].rstrip(".")
        if re.search(r"[<>*{}]", path) or path.startswith("bench/out/"):
            continue  # a pattern (tests/workflows/test_<x>.py), or what a benchmark writes
        if not (ROOT / path).exists():
            missing.append(path)
    return missing


# --------------------------------------------------------------------------------- blocks


def _spec_fields() -> set[str]:
    from shepherd.spec import JobSpec

    return set(JobSpec.model_fields)


def check_yaml(block: Block) -> list[str]:
    from shepherd.spec import SpecError, validate_spec

    try:
        data = yaml.safe_load(block.text)
    except yaml.YAMLError as exc:
        return [f"not YAML: {exc}"]
    problems = []
    header = re.match(r"#\s*(examples/\S+)", block.text)
    if header:
        on_disk = yaml.safe_load((ROOT / header[1]).read_text())
        shown = {k: on_disk.get(k) for k in data}
        if shown != data:
            problems.append(f"differs from {header[1]}: {data} != {shown}")
    if not isinstance(data, dict):
        return problems
    if {"name", "trainer", "training"} <= data.keys():
        spec = data
    elif data.keys() <= _spec_fields():  # a fragment: laid over the quickstart
        spec = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
        for key, value in data.items():
            base = spec.get(key)
            both = isinstance(base, dict) and isinstance(value, dict)
            spec[key] = {**base, **value} if both else value
    else:
        return problems  # not a job spec (a sweep: its file is compared above)
    try:
        validate_spec(spec, block.where)
    except SpecError as exc:
        problems.append(f"validate_spec refuses it: {exc}")
    return problems


def check_python(block: Block) -> list[str]:
    try:
        tree = compile(
            block.text, block.where, "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        compile(tree, block.where, "exec", ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        return [f"does not compile: {exc}"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in PROJECT:
                module = importlib.import_module(node.module)
                problems += [
                    f"{node.module} has no {alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                ]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT and not importlib.util.find_spec(alias.name):
                    problems.append(f"no module {alias.name}")
    return problems


def check_block(block: Block) -> list[str]:
    problems = [f"no such path {p}" for p in missing_paths(block.text)]
    if block.lang in SHELL:
        for line in command_lines(block.text):
            for words in variants(line):
                problems += [f"`{shlex.join(words)}`: {p}" for p in check_command(words)]
    elif block.lang == "python":
        problems += check_python(block)
    elif block.lang in {"yaml", "yml"}:
        problems += check_yaml(block)
    elif block.lang == "toml":
        try:
            tomllib.loads(block.text)
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"not TOML: {exc}")
    elif block.lang == "json":
        try:
            json.loads(block.text)
        except json.JSONDecodeError as exc:
            if not re.search(r"\{\.\.\.|\.\.\.\}|\[\.\.\.|\.\.\.\]", block.text):
                problems.append(f"not JSON: {exc}")
    elif not block.lang:  # a visibility query: the search attributes it names exist
        from shepherd.search_attributes import ALL

        names = {key.name for key in ALL}
        problems += [
            f"no search attribute {name}"
            for name in re.findall(r"\b(Shepherd[A-Z]\w*)\s*=", block.text)
            if name not in names
        ]
    return [f"{block.where} ({block.lang or 'text'}): {p}" for p in problems]


# ---------------------------------------------------------------------------------- links


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", page(doc).prose, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(doc: Path) -> list[str]:
    prose = re.sub(r"`[^`\n]*`", "", page(doc).prose)  # code spans hold no links
    problems = []
    for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose):
        target = m[1]
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto: ...
            continue
        line = prose.count("\n", 0, m.start()) + 1
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        where = f"{doc.relative_to(ROOT)}:{line}: [{target}]"
        if not file.exists():
            problems.append(f"{where}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            problems.append(f"{where}: no heading #{anchor} in {file.name}")
    return problems


# ---------------------------------------------------------------------------------- tests


@pytest.fixture(autouse=True)
def _at_the_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # commands are written to run from the repository's root


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_code_block_works_as_written(doc: Path) -> None:
    problems = [p for block in page(doc).blocks for p in check_block(block)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_command_and_path_in_inline_code_exists(doc: Path) -> None:
    problems = []
    for line, code in inline_code(doc):
        where = f"{doc.relative_to(ROOT)}:{line}: `{code}`"
        problems += [f"{where}: no such path {p}" for p in missing_paths(code)]
        if _is_command(code):
            for words in variants(code):
                problems += [f"{where}: {p}" for p in check_command(words, inline=True)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_a_commands_table_names_its_options(doc: Path) -> None:
    """A table row about `shepherd X` (docs/localplane.md's parts of the stack) names only
    options that X has."""
    problems = []
    for m in re.finditer(r"^\| `shepherd ([\w -]+)` \|(.*)$", page(doc).prose, re.M):
        command = _command(m[1].split())
        options = _options_of(command)
        problems += [
            f"{doc.relative_to(ROOT)}: shepherd {m[1]} has no option {opt}"
            for opt in re.findall(r"(?<![\w-])--[a-z][\w-]*", m[2])
            if opt not in options
        ]
    assert not problems, "\n".join(problems)


def _command(path: list[str]) -> Any:
    command = _cli()
    for name in path:
        command = command.commands[name] if hasattr(command, "commands") else command
    return command


@pytest.mark.parametrize("doc", DOCS, ids=IDS)
def test_every_relative_link_points_at_a_file(doc: Path) -> None:
    problems = broken_links(doc)
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_is_wrong() -> None:
    """The checks are not vacuous: each kind of mistake is reported."""
    assert parse_cli(["submit", "examples/quickstart.yaml", "--watch"])[0] == ["submit"]
    assert parse_cli(["schedule", "pause", "nightly"])[0] == ["schedule", "pause"]
    for wrong in (
        ["shepherd", "status", "JOB_ID", "--no-such-option"],
        ["shepherd", "no-such-command"],
        ["shepherd", "resume"],  # its JOB_ID missing
        ["shepherd", "logs", "JOB_ID", "-n", "many"],  # not an integer
        ["shepherd", "status", "JOB_ID", "extra"],
        ["shepherd", "reaper"],  # a group, not a command
        ["make", "no-such-target"],
        ["make", "test", "NO_SUCH_VARIABLE=1"],
        ["python", "bench/scale.py", "--no-such-option"],
        ["python", "bench/no_such_bench.py"],
        ["python", "-m", "shepherd.no_such_module"],
        ["curl", "-XPOST", "localhost:8300/admin/v1/no-such-route"],
        ["curl", "localhost:8300/admin/v1/stats", "-d", "{}"],  # -d: a POST, and stats is a GET
        ["curl", "-X", "DELETE", "http://127.0.0.1:8300/admin/v1/stats"],
        ["docker", "compose", "up", "--scale", "no-such-service=2"],
    ):
        assert check_command(wrong), wrong
    assert not check_command(["shepherd", "logs"], inline=True)  # a mention, not a command
    assert check_command(["shepherd", "logs", "--no-such"], inline=True)
    assert not check_command(
        ["curl", "-XPOST", "localhost:8300/admin/v1/rlorTrainerJobs/J:preempt"]
    )
    assert missing_paths("see examples/no-such.yaml") == ["examples/no-such.yaml"]
    assert variants("shepherd resume JOB_ID [--checkpoint NAME]  # a comment") == [
        ["shepherd", "resume", "JOB_ID"],
        ["shepherd", "resume", "JOB_ID", "--checkpoint", "NAME"],
    ]
    assert len(variants("shepherd schedule pause|unpause nightly")) == 2
    bad = Block(ROOT / "README.md", 1, "yaml", "name: x\ntrainer: {}\ntraining: {}\n")
    assert any("validate_spec" in p for p in check_yaml(bad))
    assert check_python(Block(ROOT / "README.md", 1, "python", "await x(\n"))
    assert not check_python(Block(ROOT / "README.md", 1, "python", "x = await f()\n"))
    assert slug("Resumable programs: surviving the worker's death") == (
        "resumable-programs-surviving-the-workers-death"
    )
