variable "name" {
  description = "Name prefix of the run (e.g. \"dlinfra-<run-id>\"); instances are named \"<name>-<node>\"."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,62}$", var.name))
    error_message = "name must be 1-63 characters of lowercase letters, digits and '-'."
  }
}

variable "run_id" {
  description = "Run id, written to the dlinfra:run-id tag of every instance and volume."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$", var.run_id))
    error_message = "run_id must be 1-48 characters of lowercase letters, digits and '-', not starting or ending with '-'."
  }
}

variable "role" {
  description = "TensorFlow task type of this group: \"chief\", \"worker\", \"ps\" or \"evaluator\" (tag dlinfra:role)."
  type        = string

  validation {
    condition     = contains(["chief", "worker", "ps", "evaluator"], var.role)
    error_message = "role must be one of \"chief\", \"worker\", \"ps\" or \"evaluator\" (TF_CONFIG task types)."
  }
}

variable "nodes" {
  description = "Nodes of this role keyed by node name \"<role>-<index>\" (e.g. \"worker-0\"): fixed private IP and raw cloud-init user data; spot, when set, overrides instance.spot for that node (a replacement that found no spot capacity runs on demand). Keys are stable, so adding a node never replaces the others."
  type = map(object({
    private_ip = string
    user_data  = string
    spot       = optional(bool)
  }))

  validation {
    condition     = length(var.nodes) > 0
    error_message = "nodes must hold at least one node."
  }
  validation {
    condition     = alltrue([for k in keys(var.nodes) : can(regex("^[a-z][a-z0-9_]*-[0-9]+$", k))])
    error_message = "node names must be \"<role>-<index>\", e.g. \"worker-0\"."
  }
  validation {
    condition     = alltrue([for n in values(var.nodes) : can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}$", n.private_ip)) && can(cidrhost("${n.private_ip}/32", 0))])
    error_message = "every private_ip must be an IPv4 address such as \"10.42.1.10\"."
  }
  validation {
    condition     = length(distinct([for n in values(var.nodes) : n.private_ip])) == length(var.nodes)
    error_message = "private_ip values must be unique within the group."
  }
  validation {
    # Bytes, not characters: base64 length * 3/4 minus padding. EC2 caps raw user data at 16 KB.
    condition     = alltrue([for n in values(var.nodes) : length(base64encode(n.user_data)) / 4 * 3 - length(regex("=*$", base64encode(n.user_data))) <= 16384])
    error_message = "user_data must be at most 16384 bytes (EC2 limit): move large files to the bucket and fetch them at boot, or gzip the payload."
  }
}

variable "instance" {
  description = "Machine settings shared by every node of the role."
  type = object({
    ami_id               = string
    instance_type        = string
    iam_instance_profile = string
    spot                 = optional(bool, false)
    placement_group      = optional(bool, false)
    root_volume_gb       = optional(number, 100)
    root_volume_kms_key  = optional(string)
    detailed_monitoring  = optional(bool, false)
  })

  validation {
    condition     = can(regex("^ami-[0-9a-z]+$", var.instance.ami_id))
    error_message = "instance.ami_id must be an AMI id such as \"ami-0123456789abcdef0\"."
  }
  validation {
    condition     = can(regex("^[a-z0-9-]+\\.[a-z0-9-]+$", var.instance.instance_type))
    error_message = "instance.instance_type must be an EC2 instance type such as \"g4dn.xlarge\"."
  }
  validation {
    condition     = length(var.instance.iam_instance_profile) > 0
    error_message = "instance.iam_instance_profile must name the node instance profile (module node_iam)."
  }
  validation {
    condition     = floor(var.instance.root_volume_gb) == var.instance.root_volume_gb && var.instance.root_volume_gb >= 8 && var.instance.root_volume_gb <= 16384
    error_message = "instance.root_volume_gb must be a whole number of GiB between 8 and 16384 (and at least the AMI's snapshot size)."
  }
}

variable "network" {
  description = "Where the nodes go: subnet, security groups, and whether they need a public IP (egress = \"public_ip\"). subnet_cidr, when known, is checked against every private_ip."
  type = object({
    subnet_id           = string
    security_group_ids  = list(string)
    subnet_cidr         = optional(string)
    associate_public_ip = optional(bool, false)
  })

  validation {
    condition     = length(var.network.security_group_ids) > 0
    error_message = "network.security_group_ids must hold the cluster security group."
  }
  validation {
    condition     = var.network.subnet_cidr == null || can(cidrhost(var.network.subnet_cidr, 0))
    error_message = "network.subnet_cidr must be an IPv4 CIDR such as \"10.42.1.0/24\", or null."
  }
}

variable "tags" {
  description = "Tags added to every resource of this module."
  type        = map(string)
  default     = {}
}
