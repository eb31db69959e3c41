"""The layout (README "Layout"): imports only run downwards, cloud SDKs only behind the cloud
boundary, and no module grows past ~400 lines without saying why. Reads every import statement,
including the lazy ones inside functions."""

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
    "cli.drill": {"infra.render", "infra.config", "infra.agent_artifact", "agent"},
    "cli.lifecycle": {"cli.policy", "cli.plan", "cli.cloud", "cli.cost", "infra.config", "infra.naming", "agent.schema"},
    "cli.cost": {"cli.cloud", "infra.config"},
    "cli.watch": {"cli.lifecycle", "cli.plan", "cli.cloud", "infra.config", "infra.naming"},
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


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_long_modules_say_why(module, path):
    lines = path.read_text().count("\n")
    if lines > 420:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "Longer than" in doc, f"{module}: {lines} lines and no reason in its docstring"


def test_app_holds_no_domain_logic():
    tree = ast.parse((ROOT / "cli" / "app.py").read_text())
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert defs == ["main"]


def test_the_timed_units_are_as_many_as_the_extra_workers_and_name_real_tests():
    from tests.conftest import TIMED_BUDGETS, TIMED_GROUPS, TIMED_UNITS, timed_unit

    units = {timed_unit(f"tests/{f}::t") for f in TIMED_GROUPS} | {timed_unit(f"tests/test_scripts_run.py::{n}[x]") for n in TIMED_BUDGETS}
    assert len(units) == TIMED_UNITS and None not in units
    source = (Path(__file__).parent / "test_scripts_run.py").read_text()
    assert all(f"def {name}(" in source for name in TIMED_BUDGETS)  # a renamed test would silently leave the unit
    assert all((Path(__file__).parent / f).exists() for f in TIMED_GROUPS)
    assert timed_unit("tests/test_move.py::test_x") is None
