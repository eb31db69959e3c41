"""Fit the availability regimes the ``default`` policy ships with (cli/policy/regimes.json).

One regime per development availability series (skypilot-spot-traces aws-10-26-2022: 8 zone/GPU
series, 600 s ticks): the hazard rates of spot windows and outages by age bucket
(cli/policy/planning.py). Only the development set is read (../shared/traces/README.md).

Run: uv run python bench/fit_regimes.py [--traces DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.policy.planning import AGE_EDGES_H, REGIMES_FILE, fit_regime  # noqa: E402
from cli.policy.simulate import load_trace  # noqa: E402

DEV = ROOT.parent / "shared" / "traces" / "skypilot-spot-traces" / "availability" / "1-node" / "aws-10-26-2022"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", type=Path, default=DEV)
    args = parser.parse_args()
    regimes = []
    for path in sorted(args.traces.glob("*.json")):
        trace = load_trace(path)
        r = fit_regime(trace.name, trace.available, trace.gap_s / 3600)
        regimes.append({"name": r.name, "up_rate": [round(x, 5) for x in r.up_rate],
                        "down_rate": [round(x, 5) for x in r.down_rate]})
    doc = {
        "source": "skypilot-spot-traces availability/1-node/aws-10-26-2022 (development set); bench/fit_regimes.py",
        "age_edges_h": [round(x, 5) for x in AGE_EDGES_H],
        "units": "run ends per hour, by age bucket of the current run",
        "regimes": regimes,
    }
    REGIMES_FILE.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(regimes)} regimes to {REGIMES_FILE}")


if __name__ == "__main__":
    main()
