################################################################################
# Image and provider
################################################################################

variable "image" {
  description = "The image to bake: AMI name and what it holds (recipe digest, dlinfra version, flavor, wheel and lock sha256), written to its tags. The digest also names the builder's resources (\"dlinfra-image-<digest[:16]>-...\")."
  type = object({
    name         = string
    digest       = string
    version      = string
    flavor       = string
    wheel_sha256 = string
    lock_sha256  = string
  })

  validation {
    condition     = can(regex("^[A-Za-z0-9()\\[\\] ./'@_-]{3,128}$", var.image.name))
    error_message = "image.name must be an AMI name: 3-128 characters of letters, digits, spaces and ()[]./'@_-, e.g. \"dlinfra-0.1.0-cpu-0123456789ab\"."
  }
  validation {
    condition     = alltrue([for d in [var.image.digest, var.image.wheel_sha256, var.image.lock_sha256] : can(regex("^[0-9a-f]{64}$", d))])
    error_message = "image.digest, image.wheel_sha256 and image.lock_sha256 must be sha256 hex digests (64 lowercase hex characters)."
  }
  validation {
    condition     = contains(["cpu", "gpu", "controller"], var.image.flavor)
    error_message = "image.flavor must be \"cpu\", \"gpu\" or \"controller\"."
  }
  validation {
    condition     = length(var.image.version) >= 1 && length(var.image.version) <= 256
    error_message = "image.version must be a dlinfra version such as \"0.1.0\" (1-256 characters: it is a tag value)."
  }
}

variable "create_ami" {
  description = "Register the AMI from the builder. False while the builder runs the recipe; the caller applies again with true once the builder reported completion."
  type        = bool
  default     = false
}

variable "region" {
  description = "AWS region of the builder and of the AMI, e.g. \"us-east-1\"."
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
# Builder
################################################################################

variable "base_ami_id" {
  description = "AMI the builder starts from. When set, ami_ssm_parameter is not read (emulators have no public AMI parameters)."
  type        = string
  default     = null

  validation {
    condition     = var.base_ami_id == null || can(regex("^ami-[0-9a-z]+$", var.base_ami_id))
    error_message = "base_ami_id must be an AMI id such as \"ami-0123456789abcdef0\", or null to resolve ami_ssm_parameter."
  }
}

variable "ami_ssm_parameter" {
  description = "Public SSM parameter holding the base AMI id, read when base_ami_id is null. Default: AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04), x86_64, as for run nodes."
  type        = string
  default     = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"

  validation {
    condition     = can(regex("^/[A-Za-z0-9_.\\-/]+$", var.ami_ssm_parameter))
    error_message = "ami_ssm_parameter must be an SSM parameter path starting with '/', e.g. \"/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id\"."
  }
}

variable "user_data" {
  description = "Raw cloud-init user data of the builder: fetch the wheel, run the image recipe, report completion to the bucket."
  type        = string

  validation {
    # Bytes, not characters: base64 length * 3/4 minus padding. EC2 caps raw user data at 16 KB.
    condition     = length(base64encode(var.user_data)) / 4 * 3 - length(regex("=*$", base64encode(var.user_data))) <= 16384
    error_message = "user_data must be at most 16384 bytes (EC2 limit): move large files to the bucket and fetch them at boot."
  }
}

variable "instance_type" {
  description = "EC2 instance type of the builder. It only installs packages: no GPU is needed, even for the gpu flavor."
  type        = string
  default     = "m5.xlarge"

  validation {
    condition     = can(regex("^[a-z0-9-]+\\.[a-z0-9-]+$", var.instance_type))
    error_message = "instance_type must be an EC2 instance type such as \"m5.xlarge\"."
  }
}

variable "root_volume_gb" {
  description = "Root volume of the builder in GiB, and so the smallest root volume of every node launched from the AMI."
  type        = number
  default     = 100

  validation {
    condition     = floor(var.root_volume_gb) == var.root_volume_gb && var.root_volume_gb >= 8 && var.root_volume_gb <= 16384
    error_message = "root_volume_gb must be a whole number of GiB between 8 and 16384 (and at least the base AMI's snapshot size)."
  }
}

variable "ssm_access" {
  description = "Let operators open a Session Manager shell on the builder: Session Manager's channels only, never the account's SSM parameters. There is never an SSH port."
  type        = bool
  default     = false
}

################################################################################
# Network
################################################################################

variable "network" {
  description = "Network of the builder: a VPC of its own with a subnet and egress to package mirrors (the builder pip-installs), or an existing VPC and subnet (set vpc_id and subnet_id together)."
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
    error_message = "network.egress must be \"nat\" (private subnet behind a NAT gateway), \"public_ip\" (public IP, no NAT) or \"none\" (S3 endpoint only: pip then needs an index reachable without internet)."
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

################################################################################
# Store
################################################################################

variable "bucket" {
  description = "Existing results bucket holding the wheel and receiving the completion marker; this stack never creates or deletes it."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix of this image in the bucket (e.g. \"runs/images/<digest>\"): the wheel is read from it and the completion marker written to it; the builder's role reaches nothing else."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*$", var.prefix))
    error_message = "prefix must be path segments joined by single '/', without a leading or trailing '/' and without wildcards, e.g. \"runs/images/0123abcd\"."
  }
}

variable "tags" {
  description = "Tags on every resource (provider default_tags); dlinfra:image-digest = image.digest is always added."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) >= 1 && length(k) <= 128 && length(v) <= 256 && !startswith(lower(k), "aws:")])
    error_message = "tags keys must be 1-128 characters not starting with \"aws:\", values at most 256 characters."
  }
}
