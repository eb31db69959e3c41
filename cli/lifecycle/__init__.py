"""The lifecycle core: what happens to a job between preemptions.

Owns: the change pipeline every applying command goes through (``pipeline``: observe, decide,
preview, confirm, write, apply, undo; its parts ``applying``, the ``applying`` mark, and
``gangstop``), the state machine with a reason on every edge (``states``), a job's recorded events
(``events``), a new job's entry (``launch``), zone moves (``move`` decides, ``mover`` acts), cleanup's parts and the
disk-deletion rule's ownership half (``cleanup``, ``ownership``), disks no job declares and move
snapshots (``orphans``), status (``status``), the live policy path and what the stack's history taught it
(``capacity``: measured changeovers, progress and spot windows; ``stacks/.spotctl/<stack>.policy.json``), stack
files edited atomically under a lock (``stackfile``, a package of rooms), the Pulumi project and its selected stack
(``workspace``), trainer logs (``logs``) and applying with Pulumi's Automation API
(``apply``). Pure decisions (``states``, ``events``' parsing) are kept apart from I/O; the clock is
passed in.

May import: ``cli.policy``, ``cli.plan``, ``cli.cost`` (prices), ``cli.cloud`` (the ``Cloud`` object and its data types,
never an SDK), ``infra.config`` and ``infra.naming``. Never ``cli.app``.
"""
