"""The layout (docs/contributing.md "Layout"): imports only run downwards, no module imports itself through a
circle of others, cloud SDKs only behind the cloud boundary, and no module grows past ~500 lines.
Reads every import statement, including the lazy ones inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLOUD_SDKS = ("boto3", "botocore", "google", "requests")
PULUMI = ("pulumi", "pulumi_aws", "pulumi_gcp")

# part -> the parts of spotctl it may import (besides itself). `cli.commands` and `cli.app` may import all.
ALLOWED = {
    # The VM agent (stdlib only, tests/test_agent_compat.py): its schema is shared downwards.
    "agent": set(),
    "infra": {"infra", "agent"},
    "cli.policy": set(),
    "cli.plan": {"infra"},
    "cli.cloud": {"infra.config", "infra.naming"},
    "cli.pools": {"cli.cloud", "infra.config", "infra.naming"},
    "cli.drill": {"infra.render", "infra.config", "infra.naming", "cli.code", "infra.agent_artifact", "agent"},
    "cli.lifecycle": {"cli.policy", "cli.plan", "cli.cloud", "cli.cost", "infra.config", "infra.naming", "agent.schema"},
    "cli.cost": {"cli.cloud", "infra.config"},
    "cli.watch": {"cli.lifecycle", "cli.plan", "cli.cloud", "cli.pools", "infra.config", "infra.naming"},
    "cli.code": {"cli.cloud", "infra.config", "infra.naming"},
}
# infra.basics is the part of the config model without pydantic (states, capacities, ConfigError):
# whatever may import infra.config may import it.
for _allowed in ALLOWED.values():
    if "infra.config" in _allowed:
        _allowed.add("infra.basics")


def modules() -> list[tuple[str, Path]]:
    out = []
    for top in ("agent", "cli", "infra"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.append((".".join(parts), path))
    return out


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def part_of(module: str) -> str | None:
    for part in sorted(ALLOWED, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    return None


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_walk_sees_every_part():
    names = {m for m, _ in modules()}
    for part in ALLOWED:
        assert any(part_of(m) == part for m in names), part
    assert "cli.lifecycle.apply" in names and "cli.cloud.aws" in names


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_imports_only_run_downwards(module, path):
    part = part_of(module)
    for name in imports_of(path):
        if within(name, ("cli.app", "cli.commands")):
            assert module in ("cli.__main__", "cli.app") or module.startswith("cli.commands"), f"{module} imports {name}"
        if part is None:
            continue
        own = within(name, (part,))
        if within(name, ("agent", "cli", "infra")) and not own:
            # `from cli.policy import planning` names the submodule: judge the deepest spotctl name
            assert within(name, ALLOWED[part]) or any(within(name, (a,)) or within(a, (name,)) for a in ALLOWED[part]), \
                f"{module} ({part}) imports {name}"


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_cloud_sdks_only_behind_the_boundary(module, path):
    for name in imports_of(path):
        if within(name, CLOUD_SDKS):
            assert module.startswith("cli.cloud") or module.startswith("cli.drill"), f"{module} imports {name}"
            if module.startswith("cli.drill"):
                assert name == "requests" or name.startswith("requests."), f"{module} imports {name}"
        if within(name, PULUMI):
            assert module.startswith(("infra", "cli.plan")) or module == "cli.lifecycle.apply", f"{module} imports {name}"


def test_the_core_never_imports_an_sdk_even_lazily():
    for module, path in modules():
        if part_of(module) in ("cli.lifecycle", "cli.policy", "cli.watch"):
            bad = [n for n in imports_of(path) if within(n, CLOUD_SDKS)]
            assert not bad, f"{module} imports {bad}"


def test_the_rule_catches_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cli.app import app\n    import boto3\n")
    assert {"cli.app", "cli.app.app", "boto3"} <= imports_of(bad)


MAX_LINES = 500


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_no_module_is_long(module, path):
    lines = path.read_text().count("\n")
    assert lines <= MAX_LINES, f"{module}: {lines} lines; split it so each module does one thing"


def import_graph(found: list[tuple[str, Path]]) -> dict[str, set[str]]:
    """module -> the modules of ``found`` it imports (lazily too; not under ``TYPE_CHECKING``, which never
    runs): ``from a.b import c`` names ``a.b.c`` when that is a module, else ``a.b``; importing a module
    does not count as importing its package."""
    names = {m for m, _ in found}
    graph: dict[str, set[str]] = {}
    for module, path in found:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges = set()
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
                       for n in ast.walk(block)}  # (never run: names for annotations only)
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in names:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle of imports through each strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert cycles(import_graph(modules())) == []


def test_the_rule_catches_an_import_circle(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    (tmp_path / "pkg" / "d.py").write_text("from pkg import a\n")  # imports into the circle, not part of it
    (tmp_path / "pkg" / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import x\n")
    (tmp_path / "pkg" / "f.py").write_text("from pkg.e import y\n")
    found = [(f"pkg.{p.stem}" if p.stem != "__init__" else "pkg", p) for p in sorted((tmp_path / "pkg").glob("*.py"))]
    assert cycles(import_graph(found)) == [["pkg.a", "pkg.b", "pkg.c"]]
    (tmp_path / "pkg" / "d.py").write_text("from pkg import f\n")  # d -> f -> e -> d only for the type checker
    (tmp_path / "pkg" / "c.py").write_text("import pkg\n")  # the package alone: no circle
    assert cycles(import_graph(found)) == []


def test_app_holds_no_domain_logic():
    tree = ast.parse((ROOT / "cli" / "app.py").read_text())
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert defs == ["main"]


def test_the_boot_tier_is_collected_only_when_named():
    """The README's command runs the unit suite, then `pytest tests/boot`: never the tier beside it."""
    from types import SimpleNamespace

    from tests.conftest import BOOT_DIR, pytest_ignore_collect

    def named(*args: str) -> SimpleNamespace:
        return SimpleNamespace(args=list(args), invocation_params=SimpleNamespace(dir=ROOT))

    assert pytest_ignore_collect(BOOT_DIR, named("tests")) is True  # also `pytest` alone (testpaths)
    assert pytest_ignore_collect(BOOT_DIR, named("tests/test_layout.py", "tests/")) is True
    for args in (["tests/boot"], ["tests/boot/test_boot.py::test_x[gcp]"], ["tests", str(BOOT_DIR)]):
        assert pytest_ignore_collect(BOOT_DIR, named(*args)) is None, args
    assert pytest_ignore_collect(ROOT / "tests" / "fixtures", named("tests")) is None


def test_the_timed_units_are_as_many_as_the_extra_workers_and_name_real_tests():
    from tests.conftest import BOOT_UNIT, TIMED_BUDGETS, TIMED_GROUPS, TIMED_UNITS, timed_unit

    units = {timed_unit(f"tests/{f}::t") for f in TIMED_GROUPS} | {timed_unit(f"tests/test_scripts_run.py::{n}[x]") for n in TIMED_BUDGETS}
    units |= {timed_unit(f"tests/boot/{f.name}::t") for f in (Path(__file__).parent / "boot").glob("test_*.py")}
    assert timed_unit("tests/boot/test_gcp.py::t") == BOOT_UNIT  # the whole boot tier: one unit
    assert len(units) == TIMED_UNITS and None not in units
    source = (Path(__file__).parent / "test_scripts_run.py").read_text()
    assert all(f"def {name}(" in source for name in TIMED_BUDGETS)  # a renamed test would silently leave the unit
    assert all((Path(__file__).parent / f).exists() for f in TIMED_GROUPS)
    assert timed_unit("tests/test_move.py::test_x") is None


# The stack file's rooms, lowest first (cli/lifecycle/stackfile/__init__.py says what each holds): a room
# imports only rooms before it, so each can be read knowing only those.
STACKFILE_ROOMS = ("refs", "reading", "writing", "shared", "splicing", "proposal", "locking", "jobindex", "parts",
                   "commit", "loading", "editing", "proposals")


def room_imports(path: Path) -> set[str]:
    """The stack file rooms a module imports (``from cli.lifecycle.stackfile.X import``, or X by name)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("cli.lifecycle.stackfile"):
            found |= {a.name for a in node.names} if node.module == "cli.lifecycle.stackfile" else {node.module.split(".")[3]}
    return found & set(STACKFILE_ROOMS)


def test_the_stack_file_rooms_import_only_downwards():
    folder = ROOT / "cli" / "lifecycle" / "stackfile"
    rooms = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert rooms == set(STACKFILE_ROOMS), "a new room goes into STACKFILE_ROOMS, at its place"
    for at, room in enumerate(STACKFILE_ROOMS):
        above = room_imports(folder / f"{room}.py") - set(STACKFILE_ROOMS[:at])
        assert not above, f"stackfile.{room} imports {sorted(above)}, a room above it"


def test_the_room_rule_catches_an_upward_import(tmp_path):
    bad = tmp_path / "reading.py"
    bad.write_text("from cli.lifecycle.stackfile.editing import update_job\nfrom cli.lifecycle.stackfile import refs\n")
    assert room_imports(bad) == {"editing", "refs"}
