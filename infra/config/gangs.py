"""What a multi-node job's nodes talk over, said at ``validate`` (warnings: the stack is valid).

AWS p4d/p5 gangs get a cluster placement group, an EFA-ready gang security group and one EFA per
network card (infra/aws_efa.py, contract aws.efa-interfaces), unless their nodes need a public IPv4
assigned at launch (egress public-ip, or externalIp): EC2 assigns one only to a launch with a single
network interface (InstanceNetworkInterfaceSpecification.AssociatePublicIpAddress, EC2 API Reference),
so those nodes keep one interface and NCCL runs over TCP on it.

GCP A3 High gangs get one gVNIC: GPUDirect-TCPX needs four more NICs, each in its own VPC network
and subnet, and the TCPX receive-datapath manager and NCCL plugin on the VM
(https://cloud.google.com/compute/docs/gpus/gpudirect), none of which a stack declares; NCCL runs
over TCP on the one NIC. No compact placement policy either (contract gcp.a3-gang-one-nic says why).
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
        public = cfg.cloud == "aws" and (job.external_ip or (cfg.network.egress or "s3-endpoint") == "public-ip")
        if cfg.cloud == "aws" and job.instance_type in EFA_INTERFACES and public:
            why = f"spotctl:jobs[{i}].externalIp" if job.external_ip else "spotctl:network.egress public-ip"
            out.append(f"{key}: job {job.id}'s {job.nodes} nodes get no EFA interfaces: {why} needs a public IPv4 at "
                       "launch, which EC2 assigns only to an instance launched with one network interface; NCCL runs "
                       "over TCP (use egress nat or s3-endpoint; docs/guides/cloud-aws.md, \"Multi-node jobs\")")
        if cfg.cloud == "gcp" and job.machine_type in TCPX_GANG_TYPES:
            out.append(f"{key}: job {job.id}'s {job.nodes} nodes have one NIC each, not GPUDirect-TCPX's four more, and "
                       "no compact placement policy: NCCL runs over TCP (docs/guides/cloud-gcp.md, \"Multi-node A3 jobs\")")
    return out
