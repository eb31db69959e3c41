"""spotctl's command line and its parts (docs/contributing.md "Layout" draws them).

- ``cli.app``: the Typer commands only: parse, call one function of a part, print; errors are
  caught here and nowhere else.
- ``cli.lifecycle``: the core: the change pipeline, job state machine, stack files, applying with Pulumi.
- ``cli.cloud``: the cloud boundary: every boto3 / google-cloud call.
- ``cli.policy``: the policy engine: spot/on-demand policies, planning, the simulator, fitted data.
- ``cli.cost``: the cost ledger (events + prices -> VM-hours by capacity, dollars, savings).
- ``cli.pools``: shared GPU pools: published demand -> the autoscalers' metrics, pool status.
- ``cli.drill``: the drill: a training command preempted locally under the real VM scripts.
- ``cli.plan``: the Pulumi program (``infra``) evaluated under Pulumi's mocks.

Imports only run downwards (``tests/test_layout.py`` checks it):
``app -> lifecycle -> {policy, plan, cost, cloud} -> infra``; ``cost -> cloud``; ``pools -> cloud``; ``drill -> infra``;
nothing imports ``app``.
"""
