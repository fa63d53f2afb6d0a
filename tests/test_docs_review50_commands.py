"""The user docs (README.md, docs/*.md, docs/gateway.example.toml) name only commands, flags, paths and settings
that exist, with the defaults the code has (review 50, docs walk-through).

- every `hearth ...` command line in a code block parses with the CLI (click's own parser, nothing runs); usage
  synopses (`[--flag X]`) and inline `hearth ...` mentions name only existing commands and flags;
- every repository path the docs name exists;
- every setting docs/app.md and docs/gateway.md name is a field of the settings classes, at the documented default;
  every gateway key is in docs/gateway.example.toml (docs/app.md says so); the run file in docs/training.md has
  only FinetuneConfig keys, and `hearth train --help`'s `[default]` hints are FinetuneConfig's defaults;
- the TOML in README.md and docs/gateway.md loads as gateway configuration.
"""

from __future__ import annotations

import dataclasses
import glob
import itertools
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import typer.main

from hearth.app.companions import MAX_CONTEXT
from hearth.app.settings import AppSettings
from hearth.cli import app as cli_app
from hearth.gateway.config import GatewaySettings, ProviderConfig, Timeouts, WarmSettings, config_from_dict

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLE_TOML = ROOT / "docs" / "gateway.example.toml"
CLI = typer.main.get_command(cli_app)
_CLICK = sys.modules[CLI.context_class.__module__.rsplit(".", 1)[0]]  # click, or typer's vendored copy
FLAG = re.compile(r"--[a-z][a-z0-9-]*")
PLACEHOLDER_FLAGS = {"--flag", "--flags"}  # "every key is also a --flag"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ------------------------------------------------------------------------------------------- command lines
def _blocks(text: str) -> list[list[str]]:
    """Fenced (not toml/json/python) and 4-space indented code blocks, as lists of lines."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^```(\w*)", line)
        if fence:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if fence.group(1) in ("", "bash", "sh", "shell", "console", "text"):
                out.append(lines[i + 1:j])
            i = j + 1
            continue
        if line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            out.append([ln[4:] for ln in lines[i:j]])
            i = j
            continue
        i += 1
    return out


def _hearth_part(command: str) -> str | None:
    """The `hearth ...` part of one shell command (also `torchrun ... -m hearth.cli ...`), else None."""
    command = command.strip().removeprefix("$ ").strip()
    if command.startswith("hearth "):
        return command
    m = re.search(r"-m hearth\.cli (.*)$", command)
    return "hearth " + m.group(1) if m else None


def documented_commands() -> list[tuple[str, str, str]]:
    """(doc, command line without its comment, the comment and continuation text) for every hearth command in a
    code block."""
    found = []
    for doc in DOCS:
        for block in _blocks(_text(doc)):
            joined: list[str] = []
            for line in block:  # shell continuations
                if joined and joined[-1].endswith("\\"):
                    joined[-1] = joined[-1][:-1] + " " + line.strip()
                else:
                    joined.append(line)
            for k, line in enumerate(joined):
                code, _, comment = line.partition(" #") if not line.lstrip().startswith("#") else ("", "", line)
                for command in code.split("&&"):
                    part = _hearth_part(command)
                    if part is None:
                        continue
                    extra = comment
                    for follow in joined[k + 1:]:  # a synopsis's `[--x]` lines, a comment's continuation
                        if re.match(r"^\s+(\[|#)", follow):
                            extra += " " + follow
                        else:
                            break
                    found.append((_rel(doc), part.strip(), extra))
    return found


def _resolve(args: list[str]):
    """The (sub)command the args name, its name and the rest of the args; AssertionError for an unknown one."""
    cmd, name = CLI, "hearth"
    while hasattr(cmd, "commands") and args and not args[0].startswith("-"):
        sub = cmd.get_command(cmd.context_class(cmd), args[0])
        assert sub is not None, f"`{name}` has no command {args[0]!r}"
        cmd, name, args = sub, f"{name} {args[0]}", args[1:]
    return cmd, name, args


def _options(cmd) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ())) if o.startswith("--")}


COMMANDS = documented_commands()


def test_the_docs_show_the_commands_this_test_reads():
    shown = {c.split()[1] for _, c, _ in COMMANDS}
    assert {"serve", "gateway", "eval", "corpus", "train", "export", "bench", "inspect"} <= shown, shown


@pytest.mark.parametrize("doc,command,extra", COMMANDS, ids=[f"{d}:{c[:60]}" for d, c, _ in COMMANDS])
def test_every_documented_hearth_command_parses(doc, command, extra):
    args = shlex.split(command)[1:]
    cmd, name, rest = _resolve(args)
    flags = set(FLAG.findall(" ".join(rest) + " " + extra)) - PLACEHOLDER_FLAGS
    # a synopsis's --stream/--no-stream is two flags; all of them must exist
    missing = sorted(f for f in flags if f not in _options(cmd))
    assert not missing, f"{doc}: `{command}` names flags `{name}` does not have: {missing}"
    if "[" in command or "..." in command:
        return  # a usage synopsis: its flags exist (above), its placeholders are not values
    try:
        cmd.make_context(name, list(rest))  # click's parser, conversions and required checks; no callback runs
    except _CLICK.ClickException as exc:
        pytest.fail(f"{doc}: `{command}` does not parse: {exc.format_message()}")


def _inline_spans(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [" ".join(s.split()) for s in re.findall(r"(?<!`)`([^`]+)`(?!`)", text)]


def test_every_inline_hearth_command_names_existing_commands_and_flags():
    checked, problems = 0, []
    for doc in [*DOCS, EXAMPLE_TOML]:
        for span in _inline_spans(_text(doc)):
            part = _hearth_part(span)
            if part is None:
                continue
            try:
                args = shlex.split(part)[1:]
            except ValueError:
                args = part.split()[1:]
            args = [a for a in args if a not in ("...",)]
            try:
                cmd, name, rest = _resolve(args)
            except AssertionError as exc:
                problems.append(f"{_rel(doc)}: `{span}`: {exc}")
                continue
            missing = sorted(set(FLAG.findall(" ".join(rest))) - PLACEHOLDER_FLAGS - _options(cmd))
            if missing:
                problems.append(f"{_rel(doc)}: `{span}`: {name} has no {missing}")
            checked += 1
    assert checked >= 10 and not problems, problems


# ------------------------------------------------------------------------------------------- paths
_TOP = ("src/", "tests/", "scripts/", "benchmarks/", "docs/", ".ci/", "hearth/")


def _expand(ref: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", ref)
    if not m:
        return [ref]
    return [x for alt in m.group(1).split(",") for x in _expand(ref[:m.start()] + alt + ref[m.end():])]


def _exists(ref: str, doc: Path) -> bool:
    if "<" in ref:  # benchmarks/h200/tests/<date>-<commit>.log: the folder it goes to
        ref = ref[:ref.index("<")].rsplit("/", 1)[0]
    bases = [ROOT, doc.parent, ROOT / "src"]
    return all(any(glob.glob(str(base / one)) for base in bases) for one in _expand(ref))


def test_every_repository_path_the_docs_name_exists():
    refs, missing = set(), []
    for doc in [*DOCS, EXAMPLE_TOML]:
        text = _text(doc)
        for span in _inline_spans(text):
            for token in re.split(r"[\s()`'\";]+", span):
                token = token.rstrip(".:,")
                if token.startswith(_TOP) and not token.startswith(("hearth/...",)):
                    refs.add((doc, token))
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"^[a-z]+://", link):
                refs.add((doc, link))
        for m in re.finditer(r"(?<![\w/.-])((?:scripts|tests|benchmarks|src)/[\w./{},*<>-]+\w)", text):
            if not text[:m.start()].endswith(("--out ", "OUT=")):  # what a command writes need not exist yet
                refs.add((doc, m.group(1)))
    for doc, ref in sorted(refs, key=str):
        if not _exists(ref, doc):
            missing.append(f"{_rel(doc)}: {ref}")
    assert len(refs) > 30 and not missing, missing


# ------------------------------------------------------------------------------------------- settings
APP_FIELDS = set(AppSettings.model_fields) | {"master_key_file"}  # master_key_file: read by load_settings
GATEWAY_CLASSES = {"gateway": GatewaySettings, "providers": ProviderConfig, "timeouts": Timeouts, "warm": WarmSettings}
GATEWAY_KEYS = {k for cls in GATEWAY_CLASSES.values() for k in cls.model_fields} - {"api_key"}


def _backticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z][a-z0-9_.]*)`", text))


def test_table_mentions_name_existing_settings():
    bad = []
    for doc in [*DOCS, EXAMPLE_TOML]:
        text = " ".join(_text(doc).split())
        for table, key in re.findall(r"\[(app|gateway)\]\.? ?`?([a-z][a-z0-9_]*)", text):
            fields = APP_FIELDS if table == "app" else set(GatewaySettings.model_fields)
            if key not in fields and key not in ("table", "settings", "and", "or", "sets"):
                bad.append(f"{_rel(doc)}: [{table}] {key}")
    assert not bad, bad


def test_app_docs_settings_exist_with_their_documented_defaults():
    text = " ".join(_text(ROOT / "docs" / "app.md").split())
    named = {t for t in _backticked(text) if re.match(r"^(login|signup)_", t)}
    assert named and named <= APP_FIELDS, named - APP_FIELDS
    seconds = {t for t in _backticked(text) if t.endswith("_s")}
    assert seconds <= APP_FIELDS | set(Timeouts.model_fields), seconds - APP_FIELDS - set(Timeouts.model_fields)
    defaults = re.findall(r"`([a-z_]+)` \((\d[\d,]*(?:\.\d+)?)( s)?\)", text)
    assert len(defaults) >= 8, defaults
    for name, value, _ in defaults:
        assert name in AppSettings.model_fields, name
        assert AppSettings.model_fields[name].default == float(value.replace(",", "")), (name, value)
    m = re.search(r"`\[app\] max_body_bytes` \(default (\d+) KiB\)", text)
    assert m and AppSettings.model_fields["max_body_bytes"].default == int(m.group(1)) * 1024


def test_gateway_docs_settings_exist():
    text = " ".join(_text(ROOT / "docs" / "gateway.md").split())
    # fields the server writes into its replies (an error body's held_cold_s, available_in_s): named in the docs
    # beside the settings, they are no settings; each must be a key the server's code really writes
    body_fields = set(re.findall(r'"([a-z_]+_s)"', _text(ROOT / "src" / "hearth" / "gateway" / "server.py")))
    bad = []
    for token in _backticked(text):
        if token.startswith("hearth_") or not token.endswith("_s") or token in body_fields:
            continue  # hearth_deadline_s is a request field; metric and error names are not settings
        table, _, key = token.rpartition(".")
        classes = [GATEWAY_CLASSES[table]] if table else [GatewaySettings, Timeouts, WarmSettings]
        if not any(key in cls.model_fields for cls in classes):
            bad.append(token)
    for table, key in re.findall(r"\[(gateway|providers\.timeouts|providers\.warm)\]\.([a-z_]+)", text):
        if key not in GATEWAY_CLASSES[table.rpartition(".")[2]].model_fields:
            bad.append(f"[{table}].{key}")
    assert not bad, bad


def test_every_gateway_key_is_in_the_example_toml():
    """docs/app.md: "every key is in gateway.example.toml" (set or commented out)."""
    text = _text(EXAMPLE_TOML)
    missing = sorted(k for k in GATEWAY_KEYS if not re.search(rf"^#?\s*{k}\s*=|^\[providers\.{k}\]", text, re.M)
                     and not re.search(rf"\b{k} = \{{", text))
    assert not missing, f"keys missing from docs/gateway.example.toml: {missing}"


def test_eval_docs_app_limits_are_the_app_defaults():
    text = " ".join(_text(ROOT / "docs" / "eval.md").split())
    for name in ("chat_context_turns", "prompt_memories"):
        m = re.search(rf"`{name}` = (\d+)", text)
        assert m and AppSettings.model_fields[name].default == int(m.group(1)), name
    m = re.search(r"`MAX_CONTEXT` = ([\d,]+)", text)
    assert m and int(m.group(1).replace(",", "")) == MAX_CONTEXT


def test_eval_docs_option_defaults_are_the_cli_defaults():
    text = " ".join(_text(ROOT / "docs" / "eval.md").split())
    eval_cmd = CLI.get_command(CLI.context_class(CLI), "eval")
    by_flag = {o: p for p in eval_cmd.params for o in p.opts}
    found = re.findall(r"`(--[a-z-]+)(?: [A-Z]+)?`[^`]*?default (\d+(?:\.\d+)?)", text)
    assert {f for f, _ in found} >= {"--samples", "--threshold", "--max-tokens", "--concurrency"}, found
    for flag, value in found:
        assert float(by_flag[flag].default) == float(value), (flag, value, by_flag[flag].default)
    # --timeout has no one default: each kind waits as long as the app does (hearth.envelope.REPLY_DEADLINE_S)
    from hearth.envelope import REPLY_DEADLINE_S

    assert by_flag["--timeout"].default is None
    m = re.search(r"reply_deadline_s` (\d+) for chat, `analyst_timeout_s` (\d+), `comment_timeout_s` (\d+)", text)
    assert m and tuple(map(float, m.groups())) == (REPLY_DEADLINE_S["chat"], REPLY_DEADLINE_S["analyst"],
                                                   REPLY_DEADLINE_S["feed_comment"]), m


def test_training_run_file_has_only_finetune_keys():
    from hearth.train.finetune import FinetuneConfig

    fields = {f.name for f in dataclasses.fields(FinetuneConfig)}
    text = _text(ROOT / "docs" / "training.md")
    block = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    keys = set(re.findall(r"^#?\s*([a-z_]+)\s*=", block, re.M))
    assert len(keys) > 20 and keys <= fields, keys - fields
    tomllib.loads(block)  # and it is TOML


def test_train_help_default_hints_are_the_config_defaults():
    from hearth.train.finetune import FinetuneConfig

    defaults = {f.name: f.default for f in dataclasses.fields(FinetuneConfig)}
    train = CLI.get_command(CLI.context_class(CLI), "train")
    checked = 0
    for p in train.params:
        m = re.search(r"\[([^\]]+)\]\s*$", getattr(p, "help", "") or "")
        if not m or p.name not in defaults:
            continue
        hint = m.group(1).replace("\\", "")
        try:
            value = float(hint)
        except ValueError:
            continue  # [cosine], [on], [seq-len]: words
        assert float(defaults[p.name]) == value, (p.name, hint, defaults[p.name])
        checked += 1
    assert checked >= 10


def test_toml_in_the_readme_and_gateway_docs_loads():
    env = {"HEARTH_VLLM_URL": "http://127.0.0.1:9", "HEARTH_VLLM_API_KEY": "k", "DASHSCOPE_API_KEY": "k",
           "OPENAI_API_KEY": "k"}
    provider = {"name": "p", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    blocks = [(doc, b) for doc in (ROOT / "README.md", ROOT / "docs" / "gateway.md")
              for b in re.findall(r"```toml\n(.*?)```", _text(doc), re.S)]
    assert len(blocks) >= 2
    for doc, block in [*blocks, (EXAMPLE_TOML, _text(EXAMPLE_TOML))]:
        data = tomllib.loads(block)
        data.setdefault("providers", [provider])
        config_from_dict(data, env=env)


def test_the_commands_this_file_checks_cover_every_hearth_subcommand():
    names = {name for name, _ in itertools.chain(CLI.commands.items())}
    shown = {c.split()[1] for _, c, _ in COMMANDS}
    assert names <= shown, names - shown


def _walk(cmd, name="hearth"):
    yield name, cmd
    for sub_name, sub in getattr(cmd, "commands", {}).items():
        yield from _walk(sub, f"{name} {sub_name}")


def test_cli_help_has_no_bracket_rich_would_eat():
    """typer renders help through rich, which takes an unescaped `[word]` for a style tag and drops it: `hearth serve
    --help` said "default: the TOML's  host" for `[app] host`. A bracket that starts with a letter must be written
    `\\[`; `[1]`, `[2e-4]`, `[90% of the GPU]` are left alone by rich."""
    tag = re.compile(r"(?<!\\)\[[A-Za-z_/][^\]]*\]")
    bad = [f"{name} {p.name}: {m.group(0)}" for name, cmd in _walk(CLI)
           for p in cmd.params for m in tag.finditer(getattr(p, "help", None) or "")]
    bad += [f"{name}: {m.group(0)}" for name, cmd in _walk(CLI) for m in tag.finditer(cmd.help or "")]
    assert not bad, bad
