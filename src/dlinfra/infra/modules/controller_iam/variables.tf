variable "name" {
  description = "Name of the controller's IAM role and of its instance profile."
  type        = string
  default     = "dlinfra-controller"

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.name)) && !endswith(var.name, "-node")
    error_message = "name must be 1-64 characters of letters, digits and +=,.@_- (the IAM role name rules), and must not end in -node: those are the run node roles the controller may change."
  }
}

variable "bucket" {
  description = "Name of the existing results bucket whose runs/ the controller watches."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit."
  }
}

variable "state_bucket" {
  description = "Bucket of the run stacks' Terraform state (aws.state_bucket), under dlinfra/; null: the results bucket."
  type        = string
  default     = null

  validation {
    condition     = var.state_bucket == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.state_bucket))
    error_message = "state_bucket must be a valid S3 bucket name, or null."
  }
}

variable "tags" {
  description = "Tags added to every resource of this module."
  type        = map(string)
  default     = {}
}
