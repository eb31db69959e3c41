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

    from cli.lifecycle.cachefile import read_bounded

    path = root / "Pulumi.yaml"
    if not path.is_file():
        return {}
    data = read_bounded(path, PULUMI_FILE_LIMIT, follow=True)
    if data is None:
        raise ConfigError(str(path), [f"cannot be read (not a regular file, or over {PULUMI_FILE_LIMIT >> 20} MiB)"])
    try:
        doc = yaml.safe_load(data.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as exc:
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

    name = project_settings(root).get("name")
    if not name:
        return None
    home = Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi")
    digest = hashlib.sha1(str(root / "Pulumi.yaml").encode()).hexdigest()  # noqa: S324 (Pulumi's file name)
    settings = _pulumi_json(home / "workspaces" / f"{name}-{digest}-workspace.json")
    if settings is None:
        return None
    stacks = settings.get("stacks") or {}
    backend = os.environ.get("PULUMI_BACKEND_URL")
    if not backend:
        creds = _pulumi_json(home / "credentials.json")
        backend = creds.get("current") if creds is not None else None
    if not isinstance(stacks, dict) or not all(isinstance(v, str) for v in stacks.values()):
        raise ConfigError(str(home / "workspaces" / f"{name}-{digest}-workspace.json"),
                          [f"not a Pulumi workspace file: its stacks are not names ({UNREADABLE_HINT})"])
    if isinstance(backend, str) and backend in stacks:
        return stacks[backend]
    if isinstance(settings.get("stack"), str) and settings["stack"]:
        return settings["stack"]
    return next(iter(stacks.values())) if len(stacks) == 1 else None


UNREADABLE_HINT = "give --stack NAME, or select the stack again with `pulumi stack select`"
PULUMI_FILE_LIMIT = 1 << 20  # Pulumi's workspace and credentials files: a few hundred bytes to a few KiB


def _pulumi_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file of Pulumi's, or None when there is none.

    Raises:
        ConfigError: it is there but no JSON object (also: not a regular file, over its bound, nested
            too deeply), naming the file.
    """
    from cli.lifecycle.cachefile import read_bounded
    from infra.basics import BadJson, loads_bounded

    if not os.path.lexists(path):
        return None
    data = read_bounded(path, PULUMI_FILE_LIMIT, follow=True)
    if data is None:
        raise ConfigError(str(path), [f"cannot be read (not a regular file, or over {PULUMI_FILE_LIMIT >> 20} MiB): "
                                      f"{UNREADABLE_HINT}"])
    try:
        doc = loads_bounded(data, PULUMI_FILE_LIMIT)
    except BadJson as exc:
        raise ConfigError(str(path), [f"{exc}: {UNREADABLE_HINT}"]) from None
    if not isinstance(doc, dict):
        raise ConfigError(str(path), [f"not a JSON object: {UNREADABLE_HINT}"])
    return doc
