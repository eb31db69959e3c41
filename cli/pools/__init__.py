"""Shared GPU pools: the demand a pool's scheduler publishes, and what the cloud says about the pool.

Owns: turning "N VMs wanted" into the metrics the autoscalers read (``demand``: the spot part's
share, unmet spot demand, and the on-demand fallback once spot stayed sold out for
``fallbackToOnDemand`` minutes; pure, clock injected) and the pool status (``status``). Publishing
and reading go through ``cli.cloud`` (CloudWatch / Cloud Monitoring, Auto Scaling / Compute).

May import: ``cli.cloud``, ``infra.config``, ``infra.naming``. Never ``cli.lifecycle`` or the commands.
"""
