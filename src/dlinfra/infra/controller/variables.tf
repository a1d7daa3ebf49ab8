variable "region" {
  description = "AWS region of the results bucket and of the runs the controller owns, e.g. \"us-east-1\"."
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

variable "bucket" {
  description = "Name of the existing results bucket whose hand-overs the controller serves."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit."
  }
}

variable "ami_id" {
  description = "Image the controller boots: a dlinfra image that carries dlinfra, terraform and the AWS provider."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id must be an AMI id such as \"ami-0123456789abcdef0\"."
  }
}

variable "instance_type" {
  description = "The controller's instance type: the cheapest the catalog knows for the region (it runs Terraform and a watch loop)."
  type        = string
}

variable "user_data" {
  description = "Raw cloud-init user data (rendered by dlinfra): the controller's systemd unit, started at every boot."
  type        = string
}

variable "network" {
  description = "The controller's own small VPC: a public subnet (an internet gateway, no NAT gateway to pay for) and no inbound rule."
  type = object({
    vpc_cidr    = optional(string, "10.254.0.0/24")
    subnet_cidr = optional(string, "10.254.0.0/25")
  })
  default = {}
}

variable "ssh_key_name" {
  description = "EC2 key pair for SSH, only when asked for (still no inbound rule: open one yourself); null: none."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags on every resource (provider default_tags)."
  type        = map(string)
  default     = {}
}
