"""The Pulumi program (``Pulumi.yaml``: ``main: infra/``) and what it is built from.

Owns: the stack config model and its validation (``config``, no pulumi import), resource names and
ownership labels (``naming``), the startup/shutdown scripts (``render`` over ``templates/``), the
cloud-neutral plans of jobs and pools (``common``), the per-cloud components (``aws``, ``gcp``; AWS pool groups and their demand scaling in ``aws_scaling``;
the always-on watcher VM and its identity in ``aws_watcher``, ``gcp_watcher``),
jobs' secret env values (``secrets``: which env values are Pulumi secrets, their clear values kept
out of the config model) and the program itself (``program``).

May import: pulumi and the pulumi-aws / pulumi-gcp providers. Never ``cli``: the CLI builds on the
program, not the other way round.
"""
