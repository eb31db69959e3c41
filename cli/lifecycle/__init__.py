"""The lifecycle core: what happens to a job between preemptions.

Owns: the state machine with a reason on every edge (``states``), a job's recorded events
(``events``), the job operations behind resume/failover/complete (``operations``), cleanup and the
disk-deletion rule (``cleanup``), status (``status``), the live policy path and what the stack's history taught it
(``capacity``: measured changeovers, progress and spot windows; ``stacks/.spotctl/<stack>.policy.json``), stack
files edited atomically under a lock (``stackfile``), the Pulumi project and its selected stack
(``workspace``), trainer logs (``logs``) and applying with Pulumi's Automation API
(``apply``). Pure decisions (``states``, ``events``' parsing) are kept apart from I/O; the clock is
passed in.

May import: ``cli.policy``, ``cli.plan``, ``cli.cost`` (prices), ``cli.cloud`` (the ``Cloud`` object and its data types,
never an SDK), ``infra.config`` and ``infra.naming``. Never ``cli.app``.
"""
