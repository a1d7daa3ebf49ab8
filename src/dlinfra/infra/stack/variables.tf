################################################################################
# Run and provider
################################################################################

variable "run_id" {
  description = "Run id; names every resource (\"dlinfra-<run_id>-...\") and tags it dlinfra:run-id."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$", var.run_id))
    error_message = "run_id must be 1-48 characters of lowercase letters, digits and '-', not starting or ending with '-' (IAM names derived from it are capped at 64 characters)."
  }
}

variable "region" {
  description = "AWS region of the cluster, e.g. \"us-east-1\"."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]+$", var.region))
    error_message = "region must be an AWS region code such as \"us-east-1\" or \"eu-west-2\"."
  }
}

variable "endpoint_url" {
  description = "One endpoint for every AWS service (moto, LocalStack), e.g. \"http://127.0.0.1:5000\"; null talks to real AWS."
  type        = string
  default     = null

  validation {
    condition     = var.endpoint_url == null || can(regex("^https?://[^/\\s]+(/.*)?$", var.endpoint_url))
    error_message = "endpoint_url must be an http(s) URL such as \"http://127.0.0.1:5000\", or null for real AWS."
  }
}

################################################################################
# Machine image
################################################################################

variable "ami_id" {
  description = "AMI for every node. When set, ami_ssm_parameter is not read (emulators have no public AMI parameters)."
  type        = string
  default     = null

  validation {
    condition     = var.ami_id == null || can(regex("^ami-[0-9a-z]+$", var.ami_id))
    error_message = "ami_id must be an AMI id such as \"ami-0123456789abcdef0\", or null to resolve ami_ssm_parameter."
  }
}

variable "ami_ssm_parameter" {
  description = "Public SSM parameter holding the AMI id, read when ami_id is null. Default: AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04), x86_64."
  type        = string
  default     = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"

  validation {
    condition     = can(regex("^/[A-Za-z0-9_.\\-/]+$", var.ami_ssm_parameter))
    error_message = "ami_ssm_parameter must be an SSM parameter path starting with '/', e.g. \"/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id\"."
  }
}

################################################################################
# Network
################################################################################

variable "network" {
  description = "Network of the run. By default a VPC per run with a fixed cluster subnet (private IPs are planned from subnet_cidr) behind a NAT gateway. Set vpc_id and subnet_id together to use an existing network instead."
  type = object({
    vpc_cidr           = optional(string, "10.42.0.0/16")
    subnet_cidr        = optional(string, "10.42.1.0/24")
    public_subnet_cidr = optional(string, "10.42.0.0/24")
    egress             = optional(string, "nat")
    vpc_id             = optional(string)
    subnet_id          = optional(string)
    availability_zone  = optional(string)
  })
  default = {}

  validation {
    condition     = contains(["nat", "public_ip", "none"], var.network.egress)
    error_message = "network.egress must be \"nat\" (private subnet behind a NAT gateway), \"public_ip\" (public IPs, no NAT) or \"none\" (S3 endpoint only)."
  }
  validation {
    condition = alltrue([
      for c in [var.network.vpc_cidr, var.network.subnet_cidr, var.network.public_subnet_cidr] :
      can(cidrhost(c, 0)) && can(regex("^[0-9.]+/(1[6-9]|2[0-8])$", c))
    ])
    error_message = "network.vpc_cidr, subnet_cidr and public_subnet_cidr must be IPv4 CIDRs with prefix lengths /16 to /28, e.g. \"10.42.1.0/24\"."
  }
  validation {
    condition     = (var.network.vpc_id == null) == (var.network.subnet_id == null)
    error_message = "network.vpc_id and network.subnet_id go together: set both to use an existing network, or neither to create one."
  }
}

variable "tf_ports" {
  description = "TCP port range of the TensorFlow gRPC servers, open only between cluster members."
  type = object({
    from = optional(number, 2222)
    to   = optional(number, 2223)
  })
  default = {}

  validation {
    condition     = var.tf_ports.from >= 1 && var.tf_ports.to <= 65535 && var.tf_ports.from <= var.tf_ports.to
    error_message = "tf_ports must satisfy 1 <= from <= to <= 65535, e.g. {\"from\": 2222, \"to\": 2223}."
  }
}

################################################################################
# Store
################################################################################

variable "bucket" {
  description = "Existing results bucket (created once by `dlinfra setup`); this stack never creates or deletes it."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix of this run in the bucket (e.g. \"runs/<run_id>\"); the nodes' role reaches nothing else."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*$", var.prefix))
    error_message = "prefix must be path segments joined by single '/', without a leading or trailing '/' and without wildcards, e.g. \"runs/digits-20261122-073000-ab12\"."
  }
}

variable "read_objects" {
  description = "Objects outside the run prefix that nodes read (\"bucket/key\", e.g. an s3:// data set): the node role may get them, and the S3 endpoint lets them through."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for o in var.read_objects : can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^*?]+(/\\*)?$", o))])
    error_message = "read_objects must be \"bucket/key\" strings, or \"bucket/prefix/*\" for every object under a prefix (no other wildcard), e.g. \"datasets/cifar-10-python.tar.gz\" or \"datasets/imagenet/*\"."
  }
}

variable "bucket_kms_key_arn" {
  description = "KMS key of the bucket when it uses SSE-KMS; the node role gets use of that key only. Null for SSE-S3."
  type        = string
  default     = null

  validation {
    condition     = var.bucket_kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.bucket_kms_key_arn))
    error_message = "bucket_kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID), or null for SSE-S3."
  }
}

################################################################################
# Cluster
################################################################################

variable "roles" {
  description = "Cluster shape: TensorFlow task type (\"chief\", \"worker\", \"ps\", \"evaluator\") to its machine settings and nodes. Node names are \"<role>-<index>\"; each node has a fixed private IP inside network.subnet_cidr and its raw cloud-init user data. Absent roles are simply not created."
  type = map(object({
    instance_type   = string
    ami_id          = optional(string) # a baked node image of this role's flavor; null: var.ami_id
    spot            = optional(bool, false)
    placement_group = optional(bool, false)
    root_volume_gb  = optional(number, 100)
    nodes = map(object({
      private_ip = string
      user_data  = string
      spot       = optional(bool) # overrides the role's spot for one node (an on-demand replacement)
    }))
  }))

  validation {
    condition     = alltrue([for r in values(var.roles) : r.ami_id == null || can(regex("^ami-[0-9a-z]+$", r.ami_id))])
    error_message = "roles[*].ami_id must be an AMI id such as \"ami-0123456789abcdef0\", or null for ami_id."
  }
  validation {
    condition     = length(var.roles) > 0 && alltrue([for r in values(var.roles) : length(r.nodes) > 0])
    error_message = "roles must hold at least one role, and every role at least one node."
  }
  validation {
    condition     = alltrue([for role in keys(var.roles) : contains(["chief", "worker", "ps", "evaluator"], role)])
    error_message = "roles keys must be TF_CONFIG task types: \"chief\", \"worker\", \"ps\" or \"evaluator\"."
  }
  validation {
    condition     = alltrue([for role in ["chief", "evaluator"] : length(try(var.roles[role].nodes, {})) <= 1])
    error_message = "a cluster has at most one chief node and at most one evaluator node."
  }
  validation {
    condition = alltrue(flatten([
      for role, r in var.roles : [for node in keys(r.nodes) : can(regex("^${role}-[0-9]+$", node))]
    ]))
    error_message = "node names must be \"<role>-<index>\" of their own role, e.g. \"worker-0\" under \"worker\"."
  }
  validation {
    condition     = alltrue([for r in values(var.roles) : can(regex("^[a-z0-9-]+\\.[a-z0-9-]+$", r.instance_type))])
    error_message = "every role needs instance_type, an EC2 instance type such as \"g4dn.xlarge\"."
  }
  validation {
    condition     = alltrue([for r in values(var.roles) : floor(r.root_volume_gb) == r.root_volume_gb && r.root_volume_gb >= 8 && r.root_volume_gb <= 16384])
    error_message = "root_volume_gb must be a whole number of GiB between 8 and 16384 (and at least the AMI's snapshot size)."
  }
  validation {
    condition = alltrue(flatten([
      for r in values(var.roles) : [for n in values(r.nodes) : can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}$", n.private_ip)) && can(cidrhost("${n.private_ip}/32", 0))]
    ]))
    error_message = "every private_ip must be an IPv4 address such as \"10.42.1.10\"."
  }
  validation {
    condition = length(distinct(flatten([for r in values(var.roles) : [for n in values(r.nodes) : n.private_ip]]))) == length(flatten([
      for r in values(var.roles) : [for n in values(r.nodes) : n.private_ip]
    ]))
    error_message = "private_ip values must be unique across all roles: give every node its own cidrhost(subnet_cidr, n)."
  }
  validation {
    # Bytes, not characters: base64 length * 3/4 minus padding. EC2 caps raw user data at 16 KB.
    condition = alltrue(flatten([
      for r in values(var.roles) : [for n in values(r.nodes) : length(base64encode(n.user_data)) / 4 * 3 - length(regex("=*$", base64encode(n.user_data))) <= 16384]
    ]))
    error_message = "user_data must be at most 16384 bytes per node (EC2 limit): move large files to the bucket and fetch them at boot."
  }
}

variable "ssm_access" {
  description = "Let operators open Session Manager shells on nodes: Session Manager's channels only, never the account's SSM parameters. There is never an SSH port."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags on every resource (provider default_tags); dlinfra:run-id = run_id is always added."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) >= 1 && length(k) <= 128 && length(v) <= 256 && !startswith(lower(k), "aws:")])
    error_message = "tags keys must be 1-128 characters not starting with \"aws:\", values at most 256 characters."
  }
}
