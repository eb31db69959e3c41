"""One test per AWS rule of infra/contract/aws.py: inputs that break it get the rule's error; what
spotctl declares passes (the example stacks plan cleanly in tests/test_contract.py)."""

from __future__ import annotations

import base64
import gzip

import pytest

from infra import contract
from infra.aws import Image, root_volume_gb, user_data_gzip_b64
from infra.contract import UNKNOWN, ContractError
from infra.contract import aws as rules


def broken(type_: str, props: dict, rule_id: str) -> str:
    """The error ``rule_id`` gives for ``props`` (other rules of the type are not this test's concern)."""
    found = {r.id: (r, problem) for r, problem in contract.violations(type_, props)}
    assert rule_id in found, found
    text = str(contract.error(found[rule_id][0], f"{type_} 'res'", found[rule_id][1]))
    assert f"rule {rule_id}:" in text and "fix:" in text and "source:" in text, text
    return text


def passes(type_: str, props: dict, rule_id: str) -> None:
    assert rule_id not in {r.id for r, _ in contract.violations(type_, props)}


def test_user_data_16k_counts_raw_bytes_before_base64():
    big = "#!/bin/bash\n" + "echo x\n" * 3000  # ~21 KB of text
    broken(rules.INSTANCE, {"user_data": big}, "aws.user-data-16k")
    broken(rules.LAUNCH_TEMPLATE, {"user_data": base64.b64encode(big.encode()).decode()}, "aws.user-data-16k")
    broken(rules.INSTANCE, {"user_data_base64": base64.b64encode(big.encode()).decode()}, "aws.user-data-16k")
    # gzip makes the same script fit
    packed = user_data_gzip_b64(big)
    assert len(base64.b64decode(packed)) <= rules.USER_DATA_LIMIT
    passes(rules.INSTANCE, {"user_data_base64": packed}, "aws.user-data-16k")
    passes(rules.LAUNCH_TEMPLATE, {"user_data": packed}, "aws.user-data-16k")
    passes(rules.INSTANCE, {"user_data_base64": UNKNOWN}, "aws.user-data-16k")
    # exactly at the limit is fine, one byte more is not
    passes(rules.INSTANCE, {"user_data": "x" * rules.USER_DATA_LIMIT}, "aws.user-data-16k")
    broken(rules.INSTANCE, {"user_data": "x" * (rules.USER_DATA_LIMIT + 1)}, "aws.user-data-16k")


def test_gzip_user_data_never_as_text():
    text = gzip.compress(b"#!/bin/bash\n", mtime=0).decode("latin-1")
    broken(rules.INSTANCE, {"user_data": text}, "aws.instance-binary-user-data-base64")


def test_volume_attachment_never_stops_or_forces():
    broken(rules.ATTACHMENT, {"stop_instance_before_detaching": True, "skip_destroy": True}, "aws.no-stop-before-detach")
    broken(rules.ATTACHMENT, {"force_detach": True, "skip_destroy": True}, "aws.no-stop-before-detach")
    broken(rules.ATTACHMENT, {}, "aws.no-stop-before-detach")
    passes(rules.ATTACHMENT, {"skip_destroy": True}, "aws.no-stop-before-detach")


def test_a_public_ip_is_never_asked_of_an_existing_interface():
    eni = {"primary_network_interface": {"network_interface_id": "eni-0abc"}}
    text = broken(rules.INSTANCE, {**eni, "associate_public_ip_address": True}, "aws.public-ip-only-on-new-interface")
    assert "existing interface" in text and "Elastic IP" in text
    broken(rules.INSTANCE, {**eni, "associate_public_ip_address": False}, "aws.public-ip-only-on-new-interface")
    broken(rules.INSTANCE, {"primary_network_interface": {"network_interface_id": UNKNOWN}, "associate_public_ip_address": True},
           "aws.public-ip-only-on-new-interface")
    passes(rules.INSTANCE, eni, "aws.public-ip-only-on-new-interface")
    passes(rules.INSTANCE, {**eni, "associate_public_ip_address": UNKNOWN}, "aws.public-ip-only-on-new-interface")
    passes(rules.INSTANCE, {"subnet_id": "subnet-0abc", "associate_public_ip_address": True}, "aws.public-ip-only-on-new-interface")


def test_one_time_spot_must_terminate():
    spot = {"market_type": "spot", "spot_options": {"spot_instance_type": "one-time", "instance_interruption_behavior": "stop"}}
    broken(rules.INSTANCE, {"instance_market_options": spot}, "aws.spot-one-time-terminates")
    spot["spot_options"]["instance_interruption_behavior"] = "terminate"
    passes(rules.INSTANCE, {"instance_market_options": spot}, "aws.spot-one-time-terminates")


@pytest.mark.parametrize(
    ("props", "says"),
    [
        ({"iops": 2000}, "iops 2000 outside"),
        ({"iops": 90000, "size": 1000}, "iops 90000 outside"),
        ({"throughput": 2500, "iops": 16000}, "throughput 2500"),
        ({"iops": 6000, "size": 10}, "500 per GiB"),
        ({"throughput": 1000, "iops": 3000}, "0.25 MiB/s per IOPS"),
        ({"throughput": 1000}, "0.25 MiB/s per IOPS"),
    ],
)
def test_gp3_limits(props, says):
    text = broken(rules.VOLUME, {"type": "gp3", "size": 500, **props}, "aws.gp3-performance")
    assert says in text
    passes(rules.VOLUME, {"type": "gp3", "size": 500, "iops": 8000, "throughput": 2000}, "aws.gp3-performance")


def test_security_group_without_inline_rules():
    broken(rules.SECURITY_GROUP, {"egress": [{"protocol": "-1"}]}, "aws.security-group-no-inline-rules")
    passes(rules.SECURITY_GROUP, {"vpc_id": "vpc-1"}, "aws.security-group-no-inline-rules")


def test_bucket_key_only_with_kms():
    aes = {"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}, "bucket_key_enabled": True}
    broken(rules.BUCKET_SSE, {"rules": [aes]}, "aws.bucket-key-needs-kms")
    kms = {"apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"}, "bucket_key_enabled": True}
    passes(rules.BUCKET_SSE, {"rules": [kms]}, "aws.bucket-key-needs-kms")


def test_asg_never_waits_for_capacity():
    broken(rules.ASG, {"min_size": 2}, "aws.asg-no-capacity-wait")
    broken(rules.ASG, {"wait_for_capacity_timeout": "10m"}, "aws.asg-no-capacity-wait")
    passes(rules.ASG, {"wait_for_capacity_timeout": "0"}, "aws.asg-no-capacity-wait")


def test_iam_name_prefix_lengths():
    broken(rules.ROLE, {"name_prefix": "x" * 39}, "aws.iam-name-prefix-length")
    passes(rules.ROLE, {"name_prefix": "x" * 38}, "aws.iam-name-prefix-length")
    passes(rules.INSTANCE_PROFILE, {"name_prefix": "x" * 102}, "aws.iam-name-prefix-length")
    broken(rules.INSTANCE_PROFILE, {"name_prefix": "x" * 103}, "aws.iam-name-prefix-length")


def test_event_pattern_length():
    broken(rules.EVENT_RULE, {"event_pattern": "x" * 4097}, "aws.event-pattern-4096")
    passes(rules.EVENT_RULE, {"event_pattern": "{}"}, "aws.event-pattern-4096")


def test_root_volume_grows_to_the_snapshot():
    image = Image("ami-1", "/dev/sda1", 120)
    assert root_volume_gb(100, image, "vm") == 120
    assert root_volume_gb(300, image, "vm") == 300
    with pytest.raises(ContractError, match="aws.root-volume-covers-snapshot"):
        contract.enforce("aws.root-volume-covers-snapshot", "vm", "root volume 100 GiB < snapshot")


def test_context_rules_are_registered_with_sources():
    for rid in ("aws.root-volume-covers-snapshot", "aws.subnets-one-vpc", "aws.subnet-in-its-zone", "aws.default-vpc-or-subnets"):
        r = contract.get(rid)
        assert r.types == () and r.check is None and "https://" in r.source
