"""``StackConfig``: everything under the ``spotctl:`` namespace of one stack file."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import (
    Field,
    StringConstraints,
    model_validator,
)

from infra.codespec import code_problems
from infra.config import checks
from infra.config.base import MAX_ATTEMPT, REGION_RE, ZONE_RE, _choice_message, _CrossErrors, _Model, zone_in_region
from infra.config.checks import _aws_network, _gcp_checks, _move_checks, _per_cloud, _replica_checks, _unique, _watcher_checks
from infra.config.jobs import Job, Pool
from infra.config.sections import ASG_MAX_INSTANCE_TYPES, MachinePrice, Network, Watcher


class StackConfig(_Model):
    """Everything under the ``spotctl:`` namespace of one stack file."""

    cloud: Literal["gcp", "aws"]
    region: Annotated[str, StringConstraints(strict=True, pattern=REGION_RE)]
    zones: Annotated[list[Annotated[str, StringConstraints(strict=True, pattern=ZONE_RE)]], Field(min_length=1)]
    project: str | None = None
    network: Network = Field(default_factory=Network)
    labels: dict[str, str] = Field(default_factory=dict)
    event_retention_days: Annotated[int, Field(strict=True, ge=1, le=3650)] = 30
    pools: list[Pool] = Field(default_factory=list)
    jobs: list[Job] = Field(default_factory=list)
    prices: dict[str, MachinePrice] = Field(default_factory=dict)
    watcher: Watcher | None = None
    # Job ids `spotctl cleanup` removed, with their last attempt: their events stay in the event
    # bucket (the cost ledger, `policy fit`), filed by job id and attempt, so a new job of the same id
    # must begin after them (``_cross_checks``) or the old job's `completed` would end the new one.
    retired_jobs: dict[str, Annotated[int, Field(strict=True, ge=1, le=MAX_ATTEMPT)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        # Cross-field problems are reported with their own key path, so they are collected here
        # and raised as one _CrossErrors that validate() turns into messages.
        # Rules across jobs compare only job ids (unique, not a pool's name): one job's edit is validated
        # with the stack-wide keys and that job alone (the job index in cli/lifecycle/stackfile/jobindex.py).
        # A rule comparing other fields of two jobs must also make that path read the whole file.
        problems: list[tuple[str, str]] = []
        gcp = self.cloud == "gcp"
        if gcp and not self.project:
            problems.append(("project", "required when cloud is 'gcp' (the GCP project id)"))
        for i, zone in enumerate(self.zones):
            if not zone_in_region(zone, self.region, self.cloud):
                problems.append((f"zones[{i}]", f"zone {zone!r} is not in region {self.region!r}"))
        if len(set(self.zones)) != len(self.zones):
            problems.append(("zones", "lists a zone twice"))
        for i, job in enumerate(self.jobs):
            last = self.retired_jobs.get(job.id)
            if last is None:
                continue
            job._retired_after = last
            if job.attempt <= last:
                problems.append((f"jobs[{i}].attempt", (
                    f"job id {job.id!r} belonged to a job `spotctl cleanup` removed after its attempt {last} "
                    f"(spotctl:retiredJobs); its events are kept, filed by id and attempt, and would be read as "
                    f"this job's (its `completed` would end this one): give this job another id; or, once the old "
                    f"job's disks are deleted (`spotctl cleanup` deletes them, unless run with --no-apply: a job "
                    f"of the same id declares disks of the same names), start it at attempt: {last + 1}")))
        for zone in self.network.subnets:
            if zone not in self.zones:
                problems.append((f"network.subnets.{zone}", f"zone {zone!r} is not in spotctl:zones {self.zones}"))
        from infra import catalog, limits

        catalog.problems(self, problems)  # machine types, their GPUs and zones (infra/catalog.json)
        limits.config_problems(self, problems)  # tags, spot-only and Hyperdisk-only machine types
        if gcp:
            _gcp_checks(self, problems)
        elif any(j.boot_disk == "keep" for j in self.jobs):
            i = next(i for i, j in enumerate(self.jobs) if j.boot_disk == "keep")
            problems.append((f"jobs[{i}].bootDisk", "'keep' is supported on GCP only"))
        else:
            _aws_network(problems, self)
        job_ids = {j.id for j in self.jobs}
        for i, pool in enumerate(self.pools):
            if pool.name in job_ids:
                problems.append((
                    f"pools[{i}].name",
                    f"pool {pool.name!r} has the name of a job: both write events under <stack>/{pool.name}/, "
                    "and each identity may write only under its own prefix",
                ))
        _unique(problems, "pools", "name", [p.name for p in self.pools])
        _unique(problems, "jobs", "id", [j.id for j in self.jobs])
        for i, pool in enumerate(self.pools):
            _per_cloud(problems, f"pools[{i}]", gcp, pool.machine_type, "machineType", pool.instance_types, "instanceTypes")
            if not gcp and pool.instance_types is not None and not pool.instance_types:
                problems.append((f"pools[{i}].instanceTypes", "needs at least one instance type"))
            elif not gcp and len(pool.instance_types or ()) > ASG_MAX_INSTANCE_TYPES:
                problems.append((f"pools[{i}].instanceTypes", f"{len(pool.instance_types or ())} instance types; an Auto "
                                 f"Scaling group takes at most {ASG_MAX_INSTANCE_TYPES}"))
        for i, job in enumerate(self.jobs):
            _per_cloud(problems, f"jobs[{i}]", gcp, job.machine_type, "machineType", job.instance_type, "instanceType")
            if job.zone not in self.zones:
                problems.append((f"jobs[{i}].zone", _choice_message("zone", job.zone, self.zones)))
            _move_checks(self, i, job, problems)
            _replica_checks(self, i, job, problems)
            checks._disk_kind_checks(self, i, job, problems)
            problems.extend((f"jobs[{i}].{key}", f"job {job.id}: {message}") for key, message in code_problems(job))
        _watcher_checks(self, problems)
        for key, value in self.labels.items():
            if not re.fullmatch(r"[a-z][-_a-z0-9]{0,62}", key) or not re.fullmatch(r"[-_a-z0-9]{0,63}", value):
                problems.append(
                    (f"labels.{key}", "labels must be lowercase letters, digits, '-' or '_', keys starting with a letter, "
                                      "at most 63 characters (GCP label rules, which spotctl applies on both clouds: "
                                      "https://cloud.google.com/resource-manager/docs/labels-overview#requirements)")
                )
        # Every resource carries these labels and up to GCP_SPOTCTL_LABELS_MAX of spotctl's own; GCE takes
        # at most 64 (contract rule gcp.labels-64, with its source).
        from infra.contract.gcp import MAX_LABELS, PROVIDER_LABELS
        from infra.naming import GCP_SPOTCTL_LABELS_MAX

        room = MAX_LABELS - GCP_SPOTCTL_LABELS_MAX - PROVIDER_LABELS
        if gcp and len(self.labels) > room:
            problems.append(("labels", f"{len(self.labels)} labels: at most {room} (a GCP resource takes {MAX_LABELS} "
                                       f"labels, spotctl adds up to {GCP_SPOTCTL_LABELS_MAX} of its own to a job's VM "
                                       f"and pulumi-gcp {PROVIDER_LABELS} (goog-pulumi-provisioned))"))
        if problems:
            raise _CrossErrors(problems)
        return self

    @property
    def egress(self) -> str:
        """The network's egress choice, with the cloud's default (GCP ``nat``, AWS ``s3-endpoint``)."""
        return self.network.egress or ("nat" if self.cloud == "gcp" else "s3-endpoint")

    @property
    def watcher_zone(self) -> str:
        """The watcher VM's zone (``spotctl:watcher.zone``, else the first of ``spotctl:zones``)."""
        return (self.watcher.zone if self.watcher else None) or self.zones[0]

    def job(self, job_id: str) -> Job:
        """Return the job with this id, or raise KeyError naming the ids that exist."""
        for job in self.jobs:
            if job.id == job_id:
                return job
        raise KeyError(_choice_message("job", job_id, [j.id for j in self.jobs]))
