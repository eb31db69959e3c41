"""The drill: a training command run and preempted locally under the same scripts a cloud VM runs.

Owns: the drill (``runner``), its verdicts and report (``verdict``), its code (``code``), the local VM that
executes rendered scripts (``localvm``) and the metadata/bucket emulator they talk to (``emulator``).

May import: ``infra.render`` (the scripts), ``infra.config``, ``infra.naming`` and ``cli.code`` (a job's code,
packed as ``resume`` packs it; ``code`` stages it). Never ``cli.lifecycle``, ``cli.cloud``, ``cli.app`` or a
cloud SDK: a drill needs no account.
"""
