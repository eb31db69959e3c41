"""What a multi-node job's nodes talk over, said at ``validate`` (warnings: the stack is valid).

AWS p4d/p5 gangs get a cluster placement group and an EFA-ready gang security group
(infra/aws.py, contract aws.efa-cluster-placement), but their EFA interfaces are not attached:
EC2 takes them at launch as extra network interfaces of the RunInstances request
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html), which the provider's
aws_instance only offers through its deprecated network_interface blocks (pulumi-aws Instance
network_interfaces: "To attach additional network interfaces, use the ec2.NetworkInterfaceAttachment
resource", an attachment after launch). NCCL then runs over the primary ENA interface (TCP).

GCP A3 High gangs get one gVNIC: GPUDirect-TCPX needs four more NICs, each in its own VPC network
and subnet, and the TCPX receive-datapath manager and NCCL plugin on the VM
(https://cloud.google.com/compute/docs/gpus/gpudirect), none of which a stack declares; NCCL runs
over TCP on the one NIC.
"""

from __future__ import annotations

from infra.config.stack import StackConfig
from infra.contract.aws_fleet import EFA_INTERFACES

TCPX_GANG_TYPES = ("a3-highgpu-8g",)


def gang_warnings(cfg: StackConfig) -> list[str]:
    out = []
    for i, job in enumerate(cfg.jobs):
        if job.nodes < 2:
            continue
        key = f"spotctl:jobs[{i}].{'instanceType' if cfg.cloud == 'aws' else 'machineType'}"
        if cfg.cloud == "aws" and job.instance_type in EFA_INTERFACES:
            out.append(f"{key}: job {job.id}'s {job.nodes} nodes share a cluster placement group, but spotctl attaches no "
                       f"EFA interfaces to {job.instance_type}: NCCL runs over TCP on the primary interface "
                       "(docs/guides/cloud-aws.md, \"Multi-node jobs\")")
        if cfg.cloud == "gcp" and job.machine_type in TCPX_GANG_TYPES:
            out.append(f"{key}: job {job.id}'s {job.nodes} nodes have one NIC each, not GPUDirect-TCPX's four more: NCCL "
                       "runs over TCP (docs/guides/cloud-gcp.md, \"Multi-node A3 jobs\")")
    return out
