variable "region" {
  description = "AWS region of the results bucket, e.g. \"us-east-1\"; runs in other regions pay cross-region transfer."
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
  description = "Name of the results bucket to create (globally unique)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit."
  }
}

variable "tags" {
  description = "Tags on every resource (provider default_tags)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.tags : length(k) >= 1 && length(k) <= 128 && length(v) <= 256 && !startswith(lower(k), "aws:")])
    error_message = "tags keys must be 1-128 characters not starting with \"aws:\", values at most 256 characters."
  }
}
