"""The Pulumi project around a stack file: ``Pulumi.yaml``'s settings, where stack files live
(``stackConfigDir``) and which stack ``pulumi stack select`` chose (Pulumi's workspace file)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from infra.basics import ConfigError


def project_settings(root: Path) -> dict[str, Any]:
    """``Pulumi.yaml`` of the project at ``root`` (empty when there is none)."""
    import yaml

    path = root / "Pulumi.yaml"
    if not path.is_file():
        return {}
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {str(exc).splitlines()[0]}"]) from None
    return doc if isinstance(doc, dict) else {}


def stack_config_dir(root: Path) -> Path:
    """Where the project keeps ``Pulumi.<stack>.yaml``: ``stackConfigDir`` of Pulumi.yaml, else the
    project directory itself (Pulumi's default)."""
    configured = project_settings(root).get("stackConfigDir")
    return root / str(configured) if configured else root


def selected_stack(root: Path) -> str | None:
    """The stack ``pulumi stack select`` chose for this project, as Pulumi stores it:
    ``$PULUMI_HOME/workspaces/<project>-<sha1 of Pulumi.yaml's path>-workspace.json`` (default home
    ``~/.pulumi``), ``{"stacks": {backend URL: stack}}`` with the legacy ``{"stack": name}``.
    Source: pulumi/pulumi pkg/workspace/workspace.go (settingsPath, sha1HexString) and
    pkg/workspace/settings.go (StackForBackend); the current backend is $PULUMI_BACKEND_URL or
    ``current`` in ``credentials.json`` (sdk/go/common/workspace/creds.go)."""
    import hashlib
    import json

    name = project_settings(root).get("name")
    if not name:
        return None
    home = Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")
    digest = hashlib.sha1(str(root / "Pulumi.yaml").encode()).hexdigest()  # noqa: S324 (Pulumi's file name)
    try:
        settings = json.loads((home / "workspaces" / f"{name}-{digest}-workspace.json").read_text())
    except (OSError, ValueError):
        return None
    stacks = settings.get("stacks") or {}
    backend = os.environ.get("PULUMI_BACKEND_URL")
    if not backend:
        try:
            backend = json.loads((home / "credentials.json").read_text()).get("current")
        except (OSError, ValueError):
            backend = None
    if backend in stacks:
        return str(stacks[backend])
    if settings.get("stack"):
        return str(settings["stack"])
    return str(next(iter(stacks.values()))) if len(stacks) == 1 else None
