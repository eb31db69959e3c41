"""The watcher: jobs resume, fail over and complete on their own (``spotctl watch``).

Owns: the pure decisions (``decide``: events in, actions out with reasons, clock injected), the
observe step merging and de-duplicating every event source (``observe``), the act step calling
the lifecycle core one job at a time under the stack-file lock (``act``), the journal of handled
events and the one-watcher-per-stack lease (``journal``), and the loop (``watcher``).

May import: ``cli.lifecycle`` (the change pipeline, states, events, stack files, applying, capacity),
``cli.plan``, ``cli.cloud`` (the ``Cloud`` object, never an SDK), ``infra.config`` and
``infra.naming``. Never ``cli.app`` or ``cli.commands``.
"""
