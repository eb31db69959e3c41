"""The drill: a training command run and preempted locally under the same scripts a cloud VM runs.

Owns: the drill and its verdicts (``runner``), the local VM that executes rendered scripts
(``localvm``) and the metadata/bucket emulator they talk to (``emulator``).

May import: ``infra.render`` (the scripts) and ``infra.config``. Never ``cli.lifecycle``,
``cli.cloud``, ``cli.app`` or a cloud SDK: a drill needs no account.
"""
