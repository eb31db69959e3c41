"""Where a ``--trace FILE`` is found: one resolver for every command that takes a trace (``simulate``,
``drill``), so a path that works for one works for the other."""

from pathlib import Path

from cli.commands import fail

TRACES_ENV = "SPOTCTL_TRACES"  # a directory of spot traces (e.g. a copy of skypilot-org/spot-traces)
# A folder of several data sets may hold the spot-traces copy in this subfolder.
SPOT_TRACES_SUBDIR = "skypilot-spot-traces"
TRACE_LOOKUP = (f"A relative path not found here is looked up under $SPOTCTL_TRACES (also in its {SPOT_TRACES_SUBDIR}/); "
                "a bare file name is searched for in its subfolders.")


def trace_roots() -> list[Path]:
    """The folders a relative ``--trace`` is looked up in: $SPOTCTL_TRACES when set (never a folder
    beside spotctl's own checkout: what an installed spotctl does must not depend on one)."""
    import os

    return [Path(os.environ[TRACES_ENV])] if os.environ.get(TRACES_ENV) else []


def find_trace(path: Path) -> Path:
    """The trace file ``--trace PATH`` names, for every command that takes one: PATH as given, else
    under each of ``trace_roots()`` or its ``skypilot-spot-traces/``; a bare file name not found
    there is searched for in their subfolders (the first folder holding it decides; two files of
    that name there are an error listing both). A path found nowhere is one error naming it and
    every folder searched."""
    if path.exists():
        return path
    if path.is_absolute():
        raise fail(f"{path}: trace file not found")
    roots = trace_roots()
    folders = [d for root in roots for d in (root, root / SPOT_TRACES_SUBDIR)]
    for folder in folders:
        if (folder / path).is_file():
            return folder / path
    if len(path.parts) == 1:
        for root in roots:
            # (every file, compared by name: a name is never a pattern, `*` or `?` included)
            found = sorted(p for p in root.rglob("*") if p.name == path.name and p.is_file()) if root.is_dir() else []
            if len(found) == 1:
                return found[0]
            if found:
                raise fail(f"{path}: {len(found)} trace files of that name under {root}; give one of: "
                           + ", ".join(str(p.relative_to(root)) for p in found))
    if not folders:  # nothing else was searched: say where the traces could be told to be
        raise fail(f"{path}: trace file not found in {Path.cwd()}, and {TRACES_ENV} is not set (set it to your "
                   f"traces directory, or give the file's path)")
    looked = ", ".join(str(d) for d in folders)
    raise fail(f"{path}: trace file not found here, nor under {looked}"
               + (" or their subfolders" if len(path.parts) == 1 else "") + f" (set {TRACES_ENV} to your traces directory)")
