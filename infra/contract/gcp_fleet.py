"""GCP rules outside the program's resources: deleting a regional disk, a disk grown by diskGb, the
first write of a new identity, what a multi-node A3 job's nodes talk over, pool demand and host maintenance."""

from __future__ import annotations

from infra.contract.rulebook import rule

rule("gcp.regional-disk-delete", [],
     says="A regional disk (a job's diskReplicaZones) is deleted through regionDisks.delete: disks.delete names a zone, "
          "and a regional disk is in none (404). cli/cloud/gcp.py GcpInventory.delete takes the disk's region.",
     fix="nothing to set: `spotctl cleanup --orphans` picks the API from the disk",
     source="https://cloud.google.com/compute/docs/reference/rest/v1/regionDisks/delete; "
            "https://cloud.google.com/compute/docs/reference/rest/v1/disks (Disk.region: \"Only applicable for regional "
            "resources\")")(None)

rule("gcp.grown-disk-filesystem", [],
     says="Raising diskGb grows the device, never its filesystem: the VM agent grows the ext4 filesystem online at boot "
          "when the device is larger (agent/disk.py grow).",
     fix="nothing to run by hand: the next boot grows it",
     source="https://cloud.google.com/compute/docs/disks/resize-persistent-disk (\"Resize the file system and "
            "partitions\"); https://docs.aws.amazon.com/ebs/latest/userguide/recognize-expanded-volume-linux.html")(None)

rule("gcp.first-write-after-iam-propagation", [],
     says="A new attempt's write permission on the event bucket may not be live for minutes: its `started` event is "
          "retried in the background for 10 minutes (agent/config.py first_record_s), backing off to 15 s.",
     fix="nothing to set (SPOTCTL_FIRST_RECORD_S on the VM changes the bound)",
     source="https://cloud.google.com/iam/docs/access-change-propagation (\"Typically 2 minutes, potentially 7 minutes "
            "or longer\"); https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html (eventual "
            "consistency)")(None)

rule("gcp.a3-gang-one-nic", [],
     says="A multi-node a3-highgpu-8g job gets one gVNIC per VM: GPUDirect-TCPX needs four more NICs, each in its own "
          "VPC network and subnet, and the TCPX receive-datapath manager (RxDM) and NCCL plugin running on the VM, which "
          "a stack does not declare and spotctl's VM agent does not run; NCCL runs over TCP. Nor does the gang get a "
          "compact placement policy: a job's resources are changed by the watcher's targeted update, and IAM "
          "conditions cannot name a resource policy (it is not among the Compute types conditions see), so the "
          "watcher would need compute.resourcePolicies.* on every policy of the project. `spotctl validate` warns of "
          "each such job (infra/config/gangs.py).",
     fix="run jobs that need TCPX bandwidth where the TCPX networks exist (e.g. GKE with GPUDirect-TCPX)",
     source="https://cloud.google.com/compute/docs/gpus/gpudirect (\"Maximize GPU network bandwidth with "
            "GPUDirect-TCPX\": a3-highgpu-8g, one NIC for the host plus four for the GPUs in separate VPC networks; the "
            "RxDM container, https://github.com/google/tcpgpudmarxd); https://cloud.google.com/iam/docs/"
            "conditions-resource-attributes (the Compute Engine types conditions see)")(None)

rule("gcp.watcher-publishes-pool-demand", [],
     says="A pool's autoscaler follows its demand metric; the watcher publishes each scaling pool's recorded demand "
          "(the event bucket's <stack>.spotctl/pools/<pool>.demand) every minute, as on AWS, so its project role holds "
          "monitoring.timeSeries.create (and, with fallbackToOnDemand, monitoring.timeSeries.list and "
          "compute.instanceGroupManagers.get). A grant cannot name one metric type: it covers the project's time series.",
     fix="declare spotctl:watcher, or publish `spotctl pool demand` every minute from elsewhere",
     source="https://cloud.google.com/monitoring/access-control (projects.timeSeries.create: monitoring.timeSeries.create); "
            "https://cloud.google.com/compute/docs/reference/rest/v1/regionInstanceGroupManagers/get")(None)

rule("gcp.gpu-maintenance-notice", [],
     says="GCE gives GPU VMs a one-hour notice before host maintenance stops them (instance/maintenance-event "
          "TERMINATE_ON_HOST_MAINTENANCE), other VMs 60 s. The VM agent keeps training through the notice, SIGTERMs the "
          "trainer its checkpoint budget plus 30 s of uploads before the stop, records `stopped` with reason "
          "host-maintenance and powers off (agent/maintenance.py); the watcher resumes the job and a gang's failures "
          "are the maintenance's. EC2's scheduled instance-stop/retirement/reboot events are handled the same way.",
     fix="nothing to set: a trainer that checkpoints on SIGTERM within its budget loses nothing",
     source="https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance (\"Compute Engine gives GPU VMs a 1-hour "
            "stopping notice, while normal VMs receive only a 60-second notice\"); https://docs.aws.amazon.com/AWSEC2/"
            "latest/UserGuide/monitoring-instances-status-check_sched.html (scheduled events in instance metadata)")(None)
