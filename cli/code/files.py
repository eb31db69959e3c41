"""Which files of a job's code directory are packed: in a git work tree the files git would commit
(tracked plus untracked-not-ignored: ``git ls-files -co --exclude-standard``), else every file; in
both, minus the patterns of a ``.spotctlignore`` at the directory's top."""

from __future__ import annotations

import fnmatch
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILE = ".spotctlignore"


@dataclass(frozen=True)
class Found:
    """The files to pack (paths relative to the directory, '/'-separated, sorted) and how they were chosen."""

    files: tuple[str, ...]
    how: str  # "git" or "all files"


def git_files(root: Path) -> list[str] | None:
    """The files git would commit under ``root`` (relative to it), or None when ``root`` is not in a work tree."""
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    # -z: names as stored, no quoting; relative to ``root`` (ls-files shows the cwd's subtree).
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, timeout=120)
    if listed.returncode != 0:
        return None
    return sorted({name for name in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if name})


def all_files(root: Path) -> list[str]:
    """Every file and symlink under ``root`` (symlinked directories are not followed)."""
    out = []
    for here, dirs, names in os.walk(root):
        rel = Path(here).relative_to(root)
        for d in list(dirs):
            if (Path(here) / d).is_symlink():
                dirs.remove(d)
                names.append(d)
        out += [(rel / n).as_posix() for n in names]
    return sorted(out)


def ignore_patterns(root: Path) -> list[str]:
    path = root / IGNORE_FILE
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def ignored(name: str, patterns: list[str]) -> bool:
    """gitignore's common forms: ``*.ckpt`` (any level), ``/data`` (anchored at the top), ``logs/``
    (a directory and everything under it), ``a/**/b``; ``!pattern`` re-includes; the last match wins."""
    parts = name.split("/")
    result = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        directory = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        anchored = "/" in pattern
        pattern = pattern.lstrip("/")
        # Every leading path is a candidate: a matched directory takes everything under it.
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + (0 if directory else 1))]
        for prefix in prefixes:
            target = prefix if anchored else prefix.rsplit("/", 1)[-1]
            if fnmatch.fnmatchcase(target, pattern) or fnmatch.fnmatchcase(target, pattern.replace("**/", "")):
                result = not negate
                break
    return result


def code_files(root: Path) -> Found:
    """The files to pack under ``root`` (an existing directory)."""
    listed = git_files(root)
    how = "git" if listed is not None else "all files"
    names = listed if listed is not None else all_files(root)
    patterns = ignore_patterns(root)

    def kept(name: str) -> bool:  # a tracked file deleted from the work tree, a submodule: not packed
        path = root / name
        return not ignored(name, patterns) and (path.is_symlink() or path.is_file())

    return Found(tuple(sorted({n for n in names if kept(n)})), how)
