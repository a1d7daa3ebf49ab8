variable "name" {
  description = "Name prefix for every resource of this network (e.g. \"dlinfra-<run-id>\")."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,62}$", var.name))
    error_message = "name must be 1-63 characters of lowercase letters, digits and '-', starting with a letter or digit."
  }
}

variable "vpc_cidr" {
  description = "IPv4 CIDR of the VPC created for the run. Ignored when existing_network is set."
  type        = string
  default     = "10.42.0.0/16"

  validation {
    condition     = can(cidrhost(var.vpc_cidr, 0)) && can(regex("^[0-9.]+/(1[6-9]|2[0-8])$", var.vpc_cidr))
    error_message = "vpc_cidr must be an IPv4 CIDR with a prefix length between /16 and /28, e.g. \"10.42.0.0/16\"."
  }
}

variable "subnet_cidr" {
  description = "IPv4 CIDR of the cluster subnet. Fixed so that node private IPs (cidrhost(subnet_cidr, n)) are known before apply. Must lie inside vpc_cidr. Ignored when existing_network is set."
  type        = string
  default     = "10.42.1.0/24"

  validation {
    condition     = can(cidrhost(var.subnet_cidr, 0)) && can(regex("^[0-9.]+/(1[6-9]|2[0-8])$", var.subnet_cidr))
    error_message = "subnet_cidr must be an IPv4 CIDR with a prefix length between /16 and /28, e.g. \"10.42.1.0/24\"."
  }
}

variable "public_subnet_cidr" {
  description = "IPv4 CIDR of the public subnet holding the NAT gateway (egress = \"nat\" only). Must lie inside vpc_cidr and not overlap subnet_cidr."
  type        = string
  default     = "10.42.0.0/24"

  validation {
    condition     = can(cidrhost(var.public_subnet_cidr, 0)) && can(regex("^[0-9.]+/(1[6-9]|2[0-8])$", var.public_subnet_cidr))
    error_message = "public_subnet_cidr must be an IPv4 CIDR with a prefix length between /16 and /28, e.g. \"10.42.0.0/24\"."
  }
}

variable "egress" {
  description = "How nodes reach the internet for package installs: \"nat\" (private subnet behind a NAT gateway), \"public_ip\" (cluster subnet routes to an internet gateway and nodes get public IPs; no NAT bill, still no inbound rule), or \"none\" (S3 through the gateway endpoint only). Ignored when existing_network is set."
  type        = string
  default     = "nat"

  validation {
    condition     = contains(["nat", "public_ip", "none"], var.egress)
    error_message = "egress must be one of \"nat\", \"public_ip\" or \"none\"."
  }
}

variable "availability_zone" {
  description = "Availability zone of the cluster subnet (e.g. \"us-east-1a\"); null lets AWS choose. Pin it when the instance type is offered only in some zones."
  type        = string
  default     = null

  validation {
    condition     = var.availability_zone == null || can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]+[a-z]$", var.availability_zone))
    error_message = "availability_zone must look like \"us-east-1a\", or be null to let AWS choose."
  }
}

variable "existing_network" {
  description = "Use this VPC and subnet instead of creating them; only the cluster security group is created. The subnet must already give the nodes a way to S3 and to package mirrors."
  type = object({
    vpc_id    = string
    subnet_id = string
  })
  default = null

  validation {
    condition = var.existing_network == null || (
      can(regex("^vpc-[0-9a-z]+$", var.existing_network.vpc_id)) &&
      can(regex("^subnet-[0-9a-z]+$", var.existing_network.subnet_id))
    )
    error_message = "existing_network needs both vpc_id (\"vpc-...\") and subnet_id (\"subnet-...\"), or must be null to create a VPC."
  }
}

variable "tf_ports" {
  description = "TCP port range of the TensorFlow gRPC servers, opened only between members of the cluster security group."
  type = object({
    from = number
    to   = number
  })
  default = { from = 2222, to = 2223 }

  validation {
    condition = (
      floor(var.tf_ports.from) == var.tf_ports.from && floor(var.tf_ports.to) == var.tf_ports.to &&
      var.tf_ports.from >= 1 && var.tf_ports.to <= 65535 && var.tf_ports.from <= var.tf_ports.to
    )
    error_message = "tf_ports must be whole numbers with 1 <= from <= to <= 65535, e.g. { from = 2222, to = 2223 }."
  }
}

variable "s3_endpoint" {
  description = "What the S3 gateway endpoint lets the cluster reach: its results bucket, and objects (\"bucket/key\") it only reads, such as a data set. Nothing else in S3 goes through the endpoint."
  type = object({
    bucket       = string
    read_objects = optional(list(string), [])
  })

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.s3_endpoint.bucket))
    error_message = "s3_endpoint.bucket must be a valid S3 bucket name, e.g. \"my-results\"."
  }
  validation {
    condition     = alltrue([for o in var.s3_endpoint.read_objects : can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^*?]+(/\\*)?$", o))])
    error_message = "s3_endpoint.read_objects must be \"bucket/key\" strings, or \"bucket/prefix/*\" for every object under a prefix (no other wildcard), e.g. \"datasets/cifar-10-python.tar.gz\" or \"datasets/imagenet/*\"."
  }
}

variable "tags" {
  description = "Tags added to every resource of this module."
  type        = map(string)
  default     = {}
}
