"""Write the table of job states and statuses (``cli/lifecycle/glossary.py``, the text `spotctl status -h`
shows) into a Markdown file, between the table's header line and the next blank line; ``--check``
only says whether the file is current (exit 1 when not).

    uv run python tools/states_doc.py docs/guides/launch-stop.md [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cli.lifecycle.glossary import markdown  # noqa: E402

HEADER = "| name | kind | meaning |"


def updated(text: str) -> str:
    """``text`` with its states table replaced by the current one (appended when it has none)."""
    lines = text.split("\n")
    if HEADER not in lines:
        return text.rstrip("\n") + "\n\n" + markdown()
    start = lines.index(HEADER)
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[:start] + markdown().rstrip("\n").split("\n") + lines[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 when the file's table is not current")
    args = parser.parse_args(argv)
    text = args.path.read_text(encoding="utf-8")
    new = updated(text)
    if args.check:
        print(f"{args.path}: {'current' if new == text else 'out of date: run without --check'}")
        return 0 if new == text else 1
    if new != text:
        args.path.write_text(new, encoding="utf-8")
    print(f"{args.path}: {'written' if new != text else 'current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
