"""The policy engine: when to run on spot, on on-demand, or wait.

Owns: the registered policies (``policies``), the single-zone rules ``default`` applies before planning
(``reserve``), the expected-cost planner and its fitted regimes
(``planning``, ``regimes.json``; the online-learned regime and the cost per hour of progress of
jobs without a deadline), the goodness-of-fit test behind its fallback (``fitcheck``), and the trace simulator with the omniscient bound (``simulate``).

May import: numpy (and matplotlib lazily for plots). Never a cloud SDK, pulumi, ``cli.lifecycle``,
``cli.cloud`` or ``cli.app``: policies see an ``Observation`` and return a decision.
"""
