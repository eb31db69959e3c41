"""``spotctl cost --plot``: one PNG with each job's timeline (a bar per attempt, coloured by
capacity, a cross at each preemption, grey gaps for changeovers) above a bar chart of what each
job cost against what all-on-demand would have cost; a zone move is named over its changeover.
Labels sit on the bars, so no legend hunt ("$" is escaped: matplotlib reads "$...$" as maths)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from cli.cost.ledger import Costed, money

COLOURS = {"spot": "#2a9d8f", "on-demand": "#e76f51"}
GAP = "#bdbdbd"


def png_path(path: Path, example: str = "cost.png") -> Path:
    """The file ``--plot PATH`` writes, or ValueError saying why it cannot be written there: a directory
    given as the plot, or a file where a folder of its path must be (checked before any work is done).
    ``example``: the file name the message suggests in a directory given as the plot."""
    if path.is_dir():  # not "dir.png" beside it: the name a person gave was a folder, ask for a file in it
        raise ValueError(f"--plot: {path} is a directory; give a file name in it, such as {path / example}")
    # Always a PNG: matplotlib appends ".png" to a name without a suffix (and takes another suffix as
    # another format, or refuses it), so the path written is said by what this returns.
    real = path if path.suffix.lower() == ".png" else path.with_name(f"{path.name}.png")
    if real.is_dir():
        raise ValueError(f"--plot: {real} is a directory; give a file name in it, such as {real / example}")
    for folder in real.parents:
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                raise ValueError(f"--plot: {folder} is not a directory")
            break
    return real


def draw(costed: list[Costed], path: Path, now: datetime, title: str) -> Path:
    """Write the PNG to ``path`` (``path`` + ".png" unless it ends so; matplotlib, no display needed)
    and return the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    jobs = [c for c in costed if c.ledger.attempts]
    rows = max(1, len(jobs))
    fig, (ax_t, ax_c) = plt.subplots(2, 1, figsize=(11, 2.2 + 0.7 * rows + 0.5 * rows),
                                     gridspec_kw={"height_ratios": [rows, max(1.5, 0.8 * rows)]})
    first = min((a.start for c in jobs for a in c.ledger.attempts), default=now)
    span = max(mdates.date2num(now) - mdates.date2num(first), 1e-6)
    for y, c in enumerate(jobs):
        atts = c.ledger.attempts
        for prev, nxt in zip(atts, atts[1:], strict=False):
            if nxt.start > prev.end:
                ax_t.barh(y, mdates.date2num(nxt.start) - mdates.date2num(prev.end), left=mdates.date2num(prev.end),
                          height=0.35, color=GAP, hatch="//", edgecolor="white")
        for a in atts:
            left, width = mdates.date2num(a.start), mdates.date2num(a.end) - mdates.date2num(a.start)
            ax_t.barh(y, width, left=left, height=0.6, color=COLOURS.get(a.capacity, "#888888"), edgecolor="black", linewidth=0.5)
            label = f"a{a.attempt} {a.capacity}" + (f" x{a.nodes}" if a.nodes > 1 else "") + (" (running)" if a.outcome == "running" else "")
            if width < span * 0.0075 * len(label):  # would spill over its neighbours: the attempt number only
                label = f"a{a.attempt}" if width > span * 0.02 else ""
            ax_t.text(left + width / 2, y, label, ha="center", va="center", fontsize=8, color="white", clip_on=True)
            if a.outcome == "preempted":
                ax_t.plot(mdates.date2num(a.end), y, marker="X", markersize=11, color="#b00020", markeredgecolor="white")
        for m in c.ledger.moves:  # a zone move: named over its changeover (drawn up to now while it runs)
            if m.start is None:
                continue
            if m.end is None and m.in_progress and now > m.start:
                ax_t.barh(y, mdates.date2num(now) - mdates.date2num(m.start), left=mdates.date2num(m.start),
                          height=0.35, color=GAP, hatch="//", edgecolor="white")
            ax_t.text(mdates.date2num(m.start), y - 0.19, f" move {m.from_zone.rsplit('-', 1)[-1]}→{m.to_zone.rsplit('-', 1)[-1]}",
                      fontsize=7, color="#444444", va="bottom", ha="left")
    ax_t.set_yticks(range(len(jobs)), [c.ledger.job for c in jobs])
    ax_t.invert_yaxis()
    ax_t.xaxis_date()
    ax_t.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    ax_t.set_title(f"{title}: attempts by capacity (green spot, orange on-demand; X = preemption, grey = changeover)", fontsize=10)
    ax_t.axvline(mdates.date2num(now), color="black", linestyle=":", linewidth=1)
    ax_t.grid(axis="x", alpha=0.3)

    priced = [c for c in costed if c.cost is not None and c.on_demand_cost is not None]
    ys = range(len(priced))
    ax_c.barh([y - 0.2 for y in ys], [c.on_demand_cost or 0 for c in priced], height=0.4, color="#9e9e9e")
    ax_c.barh([y + 0.2 for y in ys], [c.cost or 0 for c in priced], height=0.4, color=COLOURS["spot"])
    top = max([c.on_demand_cost or 0 for c in priced] + [1.0])
    for y, c in zip(ys, priced, strict=True):
        od, paid = c.on_demand_cost or 0.0, c.cost or 0.0
        ax_c.text(od + top * 0.01, y - 0.2, f"all on-demand \\${money(od):,.2f}", va="center", fontsize=8)
        saved = f"saved \\${money(od - paid):,.2f}" + (f" ({100 * (od - paid) / od:.0f} %)" if od > 0 else "")
        ax_c.text(paid + top * 0.01, y + 0.2, f"paid \\${money(paid):,.2f}, {saved}", va="center", fontsize=8, fontweight="bold")
    ax_c.set_yticks(list(ys), [c.ledger.job for c in priced])
    ax_c.invert_yaxis()
    ax_c.set_xlim(0, top * 1.6)
    ax_c.set_xlabel("USD")
    ax_c.set_title("what each job cost vs the same VM-hours on on-demand", fontsize=10)
    ax_c.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    real = png_path(path)
    real.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(real, dpi=110, format="png")
    plt.close(fig)
    return real
