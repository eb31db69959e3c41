"""The docs site: it builds with `mkdocs build --strict` (no broken link, no page left out of the nav),
the generated references are current and cover every command, option and stack key, and the README
stays short and keeps the two commands a fresh machine runs."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import typing
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import gen_docs  # noqa: E402

FRESH_MACHINE = ["uv run spotctl drill --preempt-every 1 --verify -- python examples/reentrant_train.py",
                 "uv run pytest -n auto --dist loadgroup && uv run pytest tests/boot"]


def test_the_site_builds_strict(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_the_generated_pages_are_current():
    stale = [rel for rel, text in gen_docs.render_all().items()
             if not (ROOT / rel).exists() or (ROOT / rel).read_text(encoding="utf-8") != text]
    assert stale == [], f"run `uv run python tools/gen_docs.py`: stale {stale}"


def _commands(group, path=()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def test_every_command_and_option_is_in_the_cli_reference():
    from cli.app import app

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    seen = 0
    for path, command in _commands(typer.main.get_command(app)):
        assert f"## spotctl {' '.join(path)}\n" in page, path
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("-"):
                    assert re.search(rf"`[^`]*{re.escape(opt)}\b", page[page.index(f"## spotctl {' '.join(path)}\n"):]), (path, opt)
            seen += 1
    assert seen > 100


def test_a_new_option_shows_in_the_regenerated_cli_reference():
    """What makes the staleness check fail: an option added to a command changes the page."""
    from cli.app import app

    before = gen_docs.cli_page(app)
    grown = copy.copy(app)
    extra = typer.Typer()

    @extra.command("brand-new")
    def brand_new(dry_run: bool = typer.Option(False, "--brand-new-flag", help="A flag nobody documented.")) -> None:
        """A command nobody documented."""

    grown.registered_commands = [*app.registered_commands, *extra.registered_commands]
    after = gen_docs.cli_page(grown)
    assert after != before and "## spotctl brand-new" in after and "--brand-new-flag" in after


def _keys(model, prefix):
    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}" if prefix.endswith(":") else f"{prefix}.{field.alias or name}"
        yield path
        stack = [field.annotation]
        while stack:
            kind = stack.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                is_list = typing.get_origin(field.annotation) is list or "list[" in str(field.annotation)
                yield from _keys(kind, path + ("[]" if is_list else ""))
            else:
                stack += typing.get_args(kind)


def test_every_stack_key_is_in_the_stack_reference():
    from infra.config import StackConfig

    page = (ROOT / "docs" / "reference" / "stack.md").read_text()
    keys = list(_keys(StackConfig, "spotctl:"))
    assert {"spotctl:cloud", "spotctl:jobs[].zone", "spotctl:pools[].spotMax", "spotctl:watcher.backend"} <= set(keys)
    missing = [k for k in keys if f"| `{k}` |" not in page]
    assert missing == []


def test_the_exit_codes_page_covers_every_exit_status_the_code_uses():
    used = set()
    for path in (ROOT / "cli").rglob("*.py"):
        text = path.read_text()
        used |= {int(n) for n in re.findall(r"(?:Exit|exit)\((\d+)\)", text)}
        if "128 + " in text:
            used |= {128 + 1, 128 + 2, 128 + 15}  # SIGHUP, SIGINT, SIGTERM: the signals a command handles
    assert used - set(gen_docs.EXIT_CODES) == set(), used
    page = (ROOT / "docs" / "reference" / "exit-codes.md").read_text()
    assert all(f"| {code} |" in page for code in used)


def test_the_watcher_service_pages_create_what_the_shipped_unit_needs():
    unit = (ROOT / "examples" / "spotctl-watch@.service").read_text()
    (mkdir,) = re.findall(r"^#\s+(sudo -u spotctl mkdir [^#\n]*?)\s*(?:#|$)", unit, re.M)
    writable = re.search(r"^ReadWritePaths=(.*)$", unit, re.M)[1].split()
    for home_dir in (p for p in writable if p.startswith("/home/spotctl/")):
        assert "~spotctl/" + home_dir.removeprefix("/home/spotctl/") in mkdir.split(), home_dir
    pages = [p for p in (ROOT / "docs").rglob("*.md") if "mkdir" in p.read_text() and "spotctl-watch@" in p.read_text()]
    assert len(pages) >= 1
    for page in pages:
        lines = [line.strip() for line in page.read_text().splitlines() if "sudo -u spotctl mkdir" in line]
        assert lines and all(line == mkdir for line in lines), (page, lines)
    assert "sudo -u spotctl mkdir" not in (ROOT / "README.md").read_text() or mkdir in (ROOT / "README.md").read_text()


def test_the_watcher_service_steps_are_complete_and_in_order():
    """The guide's steps, typed on a bare machine, give the shipped unit what it assumes: its User
    (created before the mkdir runs as it), uv on systemd's default PATH (the unit runs `/usr/bin/env uv`),
    the checkout at its WorkingDirectory with its environment, its EnvironmentFile, a writable .venv;
    and `systemctl enable` comes last."""
    unit = (ROOT / "examples" / "spotctl-watch@.service").read_text()
    user = re.search(r"^User=(\S+)$", unit, re.M)[1]
    workdir = re.search(r"^WorkingDirectory=(\S+)$", unit, re.M)[1]
    env_file = re.search(r"^EnvironmentFile=-?(\S+)$", unit, re.M)[1]
    assert re.search(r"^ExecStart=/usr/bin/env uv run ", unit, re.M)
    page = (ROOT / "docs" / "guides" / "watch-service.md").read_text()
    steps = [line.strip() for line in re.search(r"```bash\n(.*?)```", page[page.index("**As a systemd service**"):], re.S)[1].splitlines()
             if line.strip() and not line.strip().startswith("#")]

    def at(pattern: str) -> int:
        found = [i for i, line in enumerate(steps) if re.search(pattern, line)]
        assert found, pattern
        return found[0]

    useradd = at(rf"^sudo useradd .*--create-home .* {user}$")
    assert useradd < at(rf"^sudo -u {user} mkdir ")
    # systemd starts services with PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin (systemd's
    # src/basic/path-util.h DEFAULT_PATH_NORMAL, github.com/systemd/systemd), so uv goes to /usr/local/bin
    uv = at(r"astral\.sh/uv/install\.sh \| sudo env UV_INSTALL_DIR=/usr/local/bin ")
    clone = at(rf"^sudo git clone \S+ {re.escape(workdir)}$")
    chown = at(rf"^sudo chown -R {user}: {re.escape(workdir)}$")
    sync = at(rf"^sudo -u {user} -H uv sync --frozen --project {re.escape(workdir)}$")
    assert max(uv, clone) < chown < sync
    instance = re.search(r"systemctl enable --now spotctl-watch@(\S+)", page)[1]
    env_path = env_file.replace("%i", instance)
    env = at(rf"sudo tee {re.escape(env_path)}")
    drop_in = at(rf"ReadWritePaths={re.escape(workdir)}/\.venv")
    enable = at(rf"^sudo systemctl enable --now spotctl-watch@{instance}$")
    assert enable > max(useradd, sync, env, drop_in, at(r"^sudo cp \S+spotctl-watch@\.service /etc/systemd/system/$"))
    platform = [(ROOT / "docs" / "getting-started" / f"platform-{c}.md").read_text() for c in ("gcp", "aws")]
    assert all("../guides/watch-service.md" in text and "sudo -u spotctl mkdir" not in text for text in platform)


def test_the_readme_is_short_and_keeps_the_fresh_machine_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S)[1].splitlines()
    assert first_block[:2] == FRESH_MACHINE
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == FRESH_MACHINE[1]  # CI runs exactly the README's test command
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target


def hand_written() -> list[Path]:
    """The README and the docs pages people write (the generated ones mirror the code's own help)."""
    generated = {ROOT / rel for rel in gen_docs.PAGES}
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p not in generated)]


def test_the_docs_name_only_stacks_that_exist():
    """Examples run against the shipped stacks: no stack name in a command that stacks/ lacks
    (the quickstarts' own new stacks are written by their runnable blocks)."""
    shipped = {p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in (ROOT / "stacks").glob("Pulumi.*.yaml")}
    assert {"example-gcp", "example-aws"} <= shipped
    written = set()
    for page in hand_written():
        text = page.read_text()
        written |= set(re.findall(r"stacks/Pulumi\.([a-z0-9-]+)\.yaml <<", text))
        written |= set(re.findall(r"> stacks/Pulumi\.([a-z0-9-]+)\.yaml", text))
    for page in hand_written():
        for used in re.findall(r"(?:--stack|-s) ([a-z][a-z0-9-]*)", page.read_text()):
            assert used in shipped | written | {"name", "stack"}, (page, used)


JOB_COMMANDS = ("resume", "failover", "complete", "stop", "cleanup", "move", "logs", "events", "status", "cost")


def _names(stack: str) -> tuple[set[str], set[str]]:
    from ruamel.yaml import YAML

    config = YAML(typ="safe").load((ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())["config"]
    return ({j["id"] for j in config.get("spotctl:jobs") or []}, {p["name"] for p in config.get("spotctl:pools") or []})


def test_the_docs_name_jobs_and_pools_their_stack_has():
    """`spotctl resume vit-finetune --stack example-gcp` names a job example-gcp has (or one a runnable
    block launched first); `spotctl pool demand g5 --stack example-aws` a pool it has."""
    launched = set()
    checked = 0
    for page in hand_written():
        text = page.read_text()
        launched |= set(re.findall(r"^\s*(?:- )?id: ([a-z0-9-]+)$", text, re.M)) | set(re.findall(r"--id ([a-z0-9-]+)", text))
        for line in text.splitlines():
            stack = re.search(r"--stack (example-(?:gcp|aws))\b", line)
            if not stack:
                continue
            jobs, pools = _names(stack[1])
            for _command, name in re.findall(r"spotctl (" + "|".join(JOB_COMMANDS) + r") ([a-z][a-z0-9-]*)\b", line):
                assert name in jobs | launched, (page.name, line)
                checked += 1
            for name in re.findall(r"spotctl pool (?:demand|status) ([a-z][a-z0-9-]*)\b", line):
                assert name in pools, (page.name, line)
                checked += 1
    assert checked >= 10


NEEDS_CLOUD = "(needs a deployed stack)"


def _needs_cloud(command: str) -> str:
    """Why an example command cannot run offline in a checkout ("" when it can): it asks a cloud API,
    the event bucket or the `pulumi` CLI."""
    words = command.split()
    sub = words[words.index("spotctl") + 1] if "spotctl" in words[:-1] else ""
    has = lambda *flags: any(w.split("=")[0] in flags for w in words)  # noqa: E731
    if has("--events-bucket", "--observe", "--subscription", "--queue-url"):
        return "reads the event bucket or asks the cloud"
    if sub == "pool" and len(words) > words.index("pool") + 1 and words[words.index("pool") + 1] in ("demand", "status"):
        return "asks the cloud's autoscaler"
    if sub == "sync":
        return "syncs with the event bucket"
    if sub in ("logs", "events") and not has("--events-dir", "--dir"):
        return "reads the event bucket"
    if sub == "cost" and not has("--events-dir"):
        return "reads the event bucket"
    if sub in ("resume", "stop", "failover", "complete", "cleanup", "move", "launch", "watch") and not has("--no-apply", "-h", "--help"):
        return "runs `pulumi` against the stack"
    return ""


def _example_commands(text: str):
    """(command, the text around it that may carry the mark): each spotctl command line of a code block
    (fenced or indented; `$ ` prompts and `\\` continuations joined), with its block and the line before it."""
    lines = text.splitlines()
    fenced, start = False, 0
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            fenced = not fenced
            start = i
            continue
        first = line.strip().removeprefix("$ ")
        if (not re.match(r"(uv run )?spotctl [a-z]", first) or (not fenced and not line.startswith("    "))
                or " — " in first):  # a title spotctl prints ("spotctl cost — stack ..."), not a command
            continue
        command, j = first, i
        while command.endswith("\\") and j + 1 < len(lines):
            j += 1
            command = command[:-1] + " " + lines[j].strip()
        top = start if fenced else i
        while not fenced and top > 0 and lines[top - 1].strip():
            top -= 1
        before = top - 1
        while before > 0 and not lines[before].strip():
            before -= 1
        yield command.split(" #")[0], "\n".join(lines[max(before, 0):j + 1])


def test_every_example_that_needs_a_cloud_says_so():
    """docs/index.md promises that every example runs as written in a checkout, except the ones marked
    "(needs a deployed stack)": an example that reads the bucket, asks a cloud or runs `pulumi` carries
    the mark on its line, in its block or on the line before the block."""
    assert NEEDS_CLOUD in (ROOT / "docs" / "index.md").read_text()
    unmarked, seen = [], 0
    for page in hand_written():
        for command, around in _example_commands(page.read_text()):
            why = _needs_cloud(command)
            if why:
                seen += 1
                if NEEDS_CLOUD not in around:
                    unmarked.append(f"{page.relative_to(ROOT)}: {command}  ({why})")
    assert seen >= 10
    assert unmarked == [], "\n".join(unmarked)


def test_the_cloud_rule_tells_offline_examples_from_cloud_ones():
    offline = ["uv run spotctl resume my-first-job --stack example-gcp --no-apply --keep-code",
               "spotctl cost bert-eval --stack example-gcp --events-dir events", "spotctl plan --stack example-gcp",
               "spotctl logs llm-pretrain --stack example-gcp --events-dir ./disk"]
    cloud = ["spotctl pool demand g5 6 --stack example-aws", "spotctl logs llm-pretrain --stack example-gcp --follow",
             "spotctl watch --stack example-gcp --once --json", "spotctl sync --stack example-gcp",
             "spotctl move llm-pretrain --to-zone us-central1-b --stack example-gcp --events-dir ./events --yes",
             "spotctl cost --stack example-gcp --events-bucket b --plot cost.png"]
    assert [c for c in offline if _needs_cloud(c)] == []
    assert [c for c in cloud if not _needs_cloud(c)] == []
    text = "Run it:\n\n```bash\nspotctl sync --stack example-gcp\n```\n"
    assert [NEEDS_CLOUD in around for _, around in _example_commands(text)] == [False]
    assert [NEEDS_CLOUD in around for _, around in _example_commands(text.replace("Run it:", f"Run it {NEEDS_CLOUD}:"))] == [True]


def test_the_catalog_page_shows_what_catalog_prints_now():
    """The catalog guide's transcripts (`$ spotctl catalog ...` and the lines up to the next `$` or the
    block's end) are what the command prints today, at 80 columns: a new price or machine shows here."""
    import os
    import shlex

    text = (ROOT / "docs" / "guides" / "catalog.md").read_text()
    shown = re.findall(r"^\$ (spotctl catalog [^\n]*)\n(.*?)(?=^\$ |^```)", text, re.M | re.S)
    assert len(shown) >= 2
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    for command, output in shown:
        result = subprocess.run([sys.executable, "-m", "cli", *shlex.split(command)[1:]], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout == output, f"docs/guides/catalog.md: `{command}` now prints:\n{result.stdout}"
