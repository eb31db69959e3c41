"""Rules across sections (a job against its pool, zones, moves, disks, the watcher, the cloud), each
adding (key path, problem) to one list; and the warnings a valid stack may still earn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.basics import NAMESPACE, JobState

if TYPE_CHECKING:
    from infra.config.stack import StackConfig

from infra.config.base import _choice_message
from infra.config.jobs import Job, Move
from infra.config.sections import AWS_EGRESS, AWS_KMS_RE, AWS_S3_ENDPOINT, GCP_EGRESS, GCP_KMS_RE, GCP_SECRET_RE, SSM_PARAMETER_RE


def _watcher_checks(cfg: StackConfig, problems: list[tuple[str, str]]) -> None:
    """The watcher's keys against the cloud and the stack's zones and network."""
    w = cfg.watcher
    if w is None:
        return
    gcp = cfg.cloud == "gcp"
    key, other = ("machineType", "instanceType") if gcp else ("instanceType", "machineType")
    if (w.instance_type if gcp else w.machine_type) is not None:
        problems.append((f"watcher.{other}", f"not used on {'GCP' if gcp else 'AWS'}; use {key}"))
    if w.zone is not None and w.zone not in cfg.zones:
        problems.append(("watcher.zone", _choice_message("zone", w.zone, cfg.zones)))
    scheme = w.backend_parts()[0]
    if scheme != ("gs" if gcp else "s3"):
        problems.append(("watcher.backend", f"a {scheme}:// backend on {'GCP' if gcp else 'AWS'}: the watcher's identity "
                         f"can be granted only a {'gs' if gcp else 's3'}:// bucket of the stack's own cloud"))
    provider = w.secrets_provider
    if provider == "passphrase":
        secret = w.passphrase_secret
        if secret is None:
            problems.append(("watcher.passphraseSecret", "required with secretsProvider 'passphrase': the name of the "
                             + ("Secret Manager secret" if gcp else "SSM parameter (SecureString)")
                             + " that holds PULUMI_CONFIG_PASSPHRASE"))
        elif not (GCP_SECRET_RE if gcp else SSM_PARAMETER_RE).fullmatch(secret):
            problems.append(("watcher.passphraseSecret", f"{secret!r} is not a valid "
                             + ("Secret Manager secret id" if gcp else "SSM parameter name")))
    else:
        if w.passphrase_secret is not None:
            problems.append(("watcher.passphraseSecret", f"only used with secretsProvider 'passphrase' (it is {provider!r})"))
        if not (GCP_KMS_RE if gcp else AWS_KMS_RE).fullmatch(provider):
            want = ("'gcpkms://projects/P/locations/L/keyRings/R/cryptoKeys/K'" if gcp
                    else "'awskms://<key id or key ARN>' (not an alias: IAM grants name the key)")
            problems.append(("watcher.secretsProvider", f"expected 'passphrase' or {want}, got {provider!r}"))
    if not gcp and cfg.egress == "s3-endpoint" and not w.external_ip:
        problems.append(("watcher.externalIp", "the watcher needs the internet (git, PyPI, the Pulumi CLI, and the EC2, "
                         "SQS and IAM APIs) but network.egress 's3-endpoint' reaches only S3: set network.egress to "
                         "'nat', 'public-ip' or 'existing', or watcher.externalIp: true"))


def _move_checks(cfg: StackConfig, i: int, job: Job, problems: list[tuple[str, str]]) -> None:
    """A move names zones of the stack, from the job's zone (before its ``start`` step) to another
    one, and never concerns a completed job (its disks only wait for ``spotctl cleanup``)."""
    move = job.move
    if move is None:
        return
    for name, zone in (("from", move.from_), ("to", move.to)):
        if zone not in cfg.zones:
            problems.append((f"jobs[{i}].move.{name}", _choice_message("zone", zone, cfg.zones)))
    if move.from_ == move.to and not move.replica_zones:  # a conversion may stay in its zone
        problems.append((f"jobs[{i}].move.to", f"is the zone the job moves from ({move.to!r})"))
    if move.replica_zones is not None:
        _conversion_checks(cfg, i, job, move, problems)
    at = move.from_ if move.step in ("snapshot", "restore") else move.to
    if job.zone != at:
        problems.append((f"jobs[{i}].zone", f"is {job.zone!r} but the move's step {move.step!r} has the job in {at!r}"))
    if job.state is JobState.COMPLETED:
        problems.append((f"jobs[{i}].move", "a completed job cannot move (finish or drop the move record first)"))
    if job.boot_disk == "keep":
        problems.append((f"jobs[{i}].move", "a job with bootDisk 'keep' cannot move yet (only its job disks would follow)"))
    if move.step in ("start", "release") and not job.zone_history:
        problems.append((f"jobs[{i}].zoneHistory", f"step {move.step!r} needs the zone the job left ({move.from_!r})"))
    for zone in move.held:
        if zone not in cfg.zones:
            problems.append((f"jobs[{i}].move.held", _choice_message("zone", zone, cfg.zones)))
    if move.attempt is not None and move.attempt > job.attempt:
        problems.append((f"jobs[{i}].move.attempt", f"is {move.attempt}, later than the job's attempt {job.attempt}"))
    generations = sum(not stay.same_disk for stay in job.zone_history) - (move.step in ("start", "release"))
    if len(move.held) > generations:
        problems.append((f"jobs[{i}].move.held", f"names {len(move.held)} zone(s) whose disks were left, but the zone "
                         f"history has only {max(generations, 0)} earlier move(s)"))


def _replica_checks(cfg: StackConfig, i: int, job: Job, problems: list[tuple[str, str]]) -> None:
    """A regional disk (GCP) lives in two distinct zones of the stack, one of them the job's; it
    moves only between them (``spotctl move`` without a snapshot)."""
    zones = job.disk_replica_zones
    if zones is None:
        return
    key = f"jobs[{i}].diskReplicaZones"
    if cfg.cloud != "gcp":
        problems.append((key, "regional persistent disks are a GCP option (AWS EBS volumes live in one zone)"))
        return
    if len(zones) != 2 or len(set(zones)) != 2:
        problems.append((key, f"needs exactly two different zones (a regional disk is replicated in two), got {zones}"))
    for zone in zones:
        if zone not in cfg.zones:
            problems.append((key, _choice_message("zone", zone, cfg.zones)))
    if job.zone not in zones:
        problems.append((f"jobs[{i}].zone", f"is {job.zone!r}, not one of its disk's replica zones {zones}"))
    converted = job.move is not None and job.move.replica_zones == zones and job.move.step in ("start", "release")
    if job.move is not None and not converted:
        problems.append((f"jobs[{i}].move", "a job with a regional disk moves between its replica zones in one step, "
                         "without a move record"))
    if job.boot_disk == "keep":
        problems.append((key, "a job with bootDisk 'keep' cannot move, so a regional disk gains it nothing"))
    _regional_series(job, key, problems)


def _regional_series(job: Job, key: str, problems: list[tuple[str, str]]) -> None:
    """The job's machine series takes a Regional Persistent Disk (gcp.regional-disk-machine-series)."""
    from infra.contract.gcp import regional_disk_problem

    problem = regional_disk_problem(job.machine_type) if job.machine_type else None
    if problem is not None:
        problems.append((key, problem))


def _conversion_checks(cfg: StackConfig, i: int, job: Job, move: Move, problems: list[tuple[str, str]]) -> None:
    """A move into a regional disk: a GCP job, two distinct zones of the stack, ``to`` one of them,
    from a zonal disk (until the start step writes ``diskReplicaZones``)."""
    key, zones = f"jobs[{i}].move.replicaZones", move.replica_zones or []
    if cfg.cloud != "gcp":
        problems.append((key, "regional persistent disks are a GCP option"))
        return
    if len(zones) != 2 or len(set(zones)) != 2:
        problems.append((key, f"needs exactly two different zones (a regional disk is replicated in two), got {zones}"))
    problems.extend((key, _choice_message("zone", z, cfg.zones)) for z in zones if z not in cfg.zones)
    if move.to not in zones:
        problems.append((key, f"does not include the zone the job moves to ({move.to!r})"))
    if move.step in ("snapshot", "restore") and job.disk_replica_zones is not None:
        problems.append((key, "the job's disk is regional already (diskReplicaZones): nothing to convert"))
    if move.held:
        problems.append((f"jobs[{i}].move.held", "a conversion to a regional disk does not move on from a refused zone"))
    if move.step in ("snapshot", "restore"):  # from start on, diskReplicaZones is written (checked there)
        _regional_series(job, key, problems)


def recorded_disk_kind(job: Job) -> str | None:
    """The kind of disk the job has run on, as the stack file tells it: ``diskKind``, else its zone
    history (a move that kept the disk was a regional disk's; disks never turn back into zonal ones),
    else unknown (a job spotctl never updated)."""
    if job.disk_kind is not None:
        return job.disk_kind
    if any(stay.same_disk for stay in job.zone_history):
        return "regional"
    return "zonal" if job.zone_history else None


def _disk_kind_checks(cfg: StackConfig, i: int, job: Job, problems: list[tuple[str, str]]) -> None:
    """``diskReplicaZones`` added to or dropped from a GCP job that has run: a RegionDisk and a Disk
    are different resources under the same name, so the job would start on a new, empty disk (the
    old one survives only through ``protect``). Refused, saying what to do instead."""
    ran = recorded_disk_kind(job)
    if cfg.cloud != "gcp" or ran is None:
        return
    now = "regional" if job.disk_replica_zones else "zonal"
    if ran == now:
        return
    said = f"diskKind: {ran}" if job.disk_kind else "as its zoneHistory shows"
    if now == "regional":
        wanted = list(job.disk_replica_zones or [])
        to = job.zone if job.zone in wanted else wanted[0]
        problems.append((f"jobs[{i}].diskReplicaZones", f"job {job.id} has run on a zonal disk ({said}): adding "
                         f"diskReplicaZones would declare a new, empty regional disk under the same name and start the job on it. "
                         f"Remove diskReplicaZones and convert {job.id}'s disk with a move instead: `spotctl move {job.id} "
                         f"--to-zone {to} --replica-zones {','.join(wanted)}` (snapshot, restore into a regional disk, start, "
                         f"release the zonal one)"))
    else:
        problems.append((f"jobs[{i}].diskReplicaZones", f"job {job.id} has run on a regional disk ({said}): "
                         f"removing diskReplicaZones would declare a new, empty zonal disk under the same name and start the job on "
                         f"it. Put diskReplicaZones back (turning a regional disk back into a zonal one is not supported)"))


def _gcp_checks(cfg: StackConfig, problems: list[tuple[str, str]]) -> None:
    """GCP-only cross checks: the subnetwork of a custom network, machine type vs GPUs (the one
    table in infra/contract/gcp.py), and the egress choice."""
    from infra.catalog import unknown_type
    from infra.contract.gcp import gpu_problem

    net = cfg.network
    if net.network != "default" and not net.subnetwork:
        problems.append((
            "network.subnetwork",
            f"required when network is {net.network!r}: a custom-mode VPC has no subnetwork 'default' "
            f"(name the network's subnetwork in region {cfg.region!r})",
        ))
    for section, items in (("pools", cfg.pools), ("jobs", cfg.jobs)):
        for i, item in enumerate(items):
            if item.machine_type is None or unknown_type("gcp", item.machine_type):
                continue  # (an unknown type is the catalog's error, with "did you mean")
            acc = item.accelerator
            problem = gpu_problem(item.machine_type, acc.type if acc else None, acc.count if acc else None)
            if problem is not None:
                problems.append((f"{section}[{i}].{problem[0]}", problem[1]))
    if cfg.egress not in GCP_EGRESS:
        problems.append(("network.egress", _choice_message("egress", cfg.egress, GCP_EGRESS)))
    if cfg.network.s3_endpoint is not None:
        problems.append(("network.s3Endpoint", "AWS only (GCP has no S3 gateway endpoint)"))


DEADLINE_POLICIES = ("greedy", "uniform-progress", "uniform-progress-nh")


def policy_warnings(cfg: StackConfig) -> list[str]:
    """Jobs whose policy will have nothing to weigh (valid config, so warnings, never errors).

    The deadline policies need ``jobHours`` and ``deadlineHours``: without them they keep spot
    however often it is preempted. ``default`` and ``n-preemptions`` work without a deadline
    (cost per hour of progress; preemptions), but a deadline without ``jobHours`` is not weighed.
    """
    out = []
    for i, job in enumerate(cfg.jobs):
        key = f"spotctl:jobs[{i}]"
        if job.policy in DEADLINE_POLICIES and not (job.job_hours and job.deadline_hours):
            out.append(f"{key}.policy: {job.policy!r} weighs a deadline, but job {job.id} has no "
                       f"{'jobHours' if job.deadline_hours else 'deadlineHours'}: it will stay on spot however often it is "
                       "preempted (set jobHours and deadlineHours, or use 'default' or 'n-preemptions')")
        elif job.deadline_hours and not job.job_hours and job.policy != "on-demand":
            out.append(f"{key}.deadlineHours: job {job.id} has no jobHours, so its deadline cannot be weighed "
                       f"({job.policy!r} decides without it)")
        elif job.job_hours and job.deadline_hours and job.job_hours > job.deadline_hours:
            out.append(f"{key}.jobHours: {job.job_hours} h of work cannot fit in deadlineHours {job.deadline_hours}: "
                       f"job {job.id} will run on-demand and still miss it")
    return out


def _unique(problems: list[tuple[str, str]], section: str, key: str, values: list[str]) -> None:
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        if value in seen:
            problems.append(
                (f"{section}[{i}].{key}", f"duplicate {key} {value!r} (also {NAMESPACE}:{section}[{seen[value]}])")
            )
        else:
            seen[value] = i


def _aws_network(problems: list[tuple[str, str]], cfg: StackConfig) -> None:
    net = cfg.network
    # A zone without a subnet would fall back to the default VPC while the security group lives in
    # the configured subnets' VPC: EC2 refuses an SG and a subnet of different VPCs.
    missing = [z for z in cfg.zones if z not in net.subnets]
    if net.subnets and missing:
        problems.append(("network.subnets", f"has no subnet for zone(s) {', '.join(missing)}: set one per zone in "
                         "spotctl:zones (all in one VPC), or none to use the default VPC"))
    egress = cfg.egress
    if egress not in AWS_EGRESS:
        problems.append(("network.egress", _choice_message("egress", egress, AWS_EGRESS)))
    if egress == "nat":
        if not net.nat_subnet:
            problems.append(("network.natSubnet", "required with egress 'nat' (a public subnet of the same VPC)"))
        if not net.subnets:
            problems.append(("network.subnets", "egress 'nat' needs private subnets of your own (the default VPC's are public)"))
        if net.nat_subnet and net.nat_subnet in net.subnets.values():
            problems.append(("network.natSubnet", "must be a public subnet other than the VMs' subnets"))
    elif net.nat_subnet:
        problems.append(("network.natSubnet", f"only used with egress 'nat' (egress is {egress!r})"))
    if net.s3_endpoint is not None:
        if net.s3_endpoint not in AWS_S3_ENDPOINT:
            problems.append(("network.s3Endpoint", _choice_message("s3Endpoint", net.s3_endpoint, AWS_S3_ENDPOINT)))
        elif egress in ("nat", "existing"):
            why = ("declares no S3 endpoint" if egress == "existing" else
                   "puts its S3 endpoint on the stack's own new route table, which no other endpoint is on")
            problems.append(("network.s3Endpoint", f"only used with egress 's3-endpoint' or 'public-ip' "
                             f"(egress {egress!r} {why})"))


def _per_cloud(problems, path, gcp, gcp_value, gcp_key, aws_value, aws_key) -> None:
    want, want_value, other, other_value = (
        (gcp_key, gcp_value, aws_key, aws_value) if gcp else (aws_key, aws_value, gcp_key, gcp_value)
    )
    cloud = "GCP" if gcp else "AWS"
    if other_value is not None:
        problems.append((f"{path}.{other}", f"not used on {cloud}; use {want}"))
    elif want_value is None:
        problems.append((f"{path}.{want}", f"required on {cloud}"))
