"""A p4d/p5 gang node's network interfaces with EFA, in a launch template (AWS).

EC2 takes a node's EFA interfaces at launch, as network interfaces of the RunInstances request
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html). aws_instance offers
additional interfaces only through a launch template (its own ``network_interface`` blocks are
deprecated, pulumi-aws Instance.network_interfaces: "To attach additional network interfaces, use
the ec2.NetworkInterfaceAttachment resource", an attach after launch, which EFA does not take).
"Launch templates where network interfaces are defined do not support setting security groups using
the SecurityGroupIds parameter" (AWS PCS, working-with_networking_efa_create-lt.html), and RunInstances
takes no instance-level subnet beside them: so the template holds every interface, the primary too
(the node's subnet and groups, or the master's own interface), and the instance gives none
(contract aws.efa-interfaces).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.aws_common import _metadata_options
from infra.contract.aws_fleet import efa_interfaces, efa_layout


def wants_efa(instance_type: str, nodes: int, public_ip: bool) -> bool:
    """A gang of an EFA type gets EFA unless its nodes need a public IPv4 assigned at launch, which EC2
    gives only to a launch with one network interface (contract aws.efa-interfaces)."""
    return nodes > 1 and bool(efa_interfaces(instance_type)) and not public_ip


def efa_gang(job, egress: str) -> bool:
    """Whether ``job``'s nodes get EFA interfaces under the stack's ``egress``."""
    return wants_efa(job.instance_type or "", job.nodes, bool(job.external_ip) or egress == "public-ip")


def efa_template(name: str, physical: str, instance_type: str, *, subnet_id, groups: list, gang_group,
                 master_eni, tags: dict, opts: pulumi.ResourceOptions) -> aws.ec2.LaunchTemplate:
    """The node's interfaces: the primary ENA one (card 0, device 0; the master's own interface when it
    has one, which keeps its address across attempts), then one EFA per network card, each in the
    gang's group, which admits and sends all traffic to itself ("Every EFA needs the security group that
    enables EFA traffic", PCS create-lt page)."""
    nic = aws.ec2.LaunchTemplateNetworkInterfaceArgs
    if master_eni is not None:
        primary = nic(device_index=0, network_card_index=0, network_interface_id=master_eni.id,
                      delete_on_termination="false")
    else:
        primary = nic(device_index=0, network_card_index=0, subnet_id=subnet_id, security_groups=groups,
                      associate_public_ip_address="false", delete_on_termination="true")
    efa = [nic(device_index=device, network_card_index=card, interface_type="efa", subnet_id=subnet_id,
               security_groups=[gang_group], delete_on_termination="true",
               description=f"{physical}: EFA on network card {card}")
           for card, device in efa_layout(instance_type)]
    return aws.ec2.LaunchTemplate(
        f"{name}-efa-template",
        name_prefix=f"{physical}-efa-",
        description=f"{physical}: primary interface and {len(efa)} EFA interfaces",
        instance_type=instance_type,
        # IMDSv2 as on the instance (which sets it too: its own settings override the template's).
        metadata_options=_metadata_options(aws.ec2.LaunchTemplateMetadataOptionsArgs),
        network_interfaces=[primary, *efa],
        tags=tags,
        opts=opts,
    )


def instance_networking(template, subnet_id, groups: list, master_eni, public_ip: bool) -> dict:
    """aws.ec2.Instance's network arguments: the EFA template's, else the node's subnet and groups, or
    the master's own interface (its address kept across attempts)."""
    if template is not None:
        return {"launch_template": aws.ec2.InstanceLaunchTemplateArgs(id=template.id, version=template.latest_version.apply(str))}
    if master_eni is not None:
        return {"primary_network_interface": aws.ec2.InstancePrimaryNetworkInterfaceArgs(network_interface_id=master_eni.id)}
    return {"subnet_id": subnet_id, "vpc_security_group_ids": groups, "associate_public_ip_address": public_ip}
