"""``spotctl plan``: the Pulumi program (``infra``) evaluated in-process under Pulumi's mocks.

Owns: the recording mock monitor, engine-identical URNs, mocked invoke answers and the plan's
rendering (``mocks``); what the SDK's runtime skips while the program runs there (``runtime``: the
cyclic GC, source positions, debug messages nobody sees; its own event loop). May import:
``infra`` and pulumi. Never ``cli.lifecycle``, ``cli.cloud`` or ``cli.app``.
"""
