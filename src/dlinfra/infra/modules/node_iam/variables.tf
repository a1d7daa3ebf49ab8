variable "name" {
  description = "Name of the IAM role and of its instance profile (e.g. \"dlinfra-<run-id>-node\")."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", var.name))
    error_message = "name must be 1-64 characters of letters, digits and +=,.@_- (the IAM role name rules); shorten the run id if it is too long."
  }
}

variable "bucket" {
  description = "Name of the existing results bucket the nodes write to."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit."
  }
}

variable "prefix" {
  description = "Key prefix inside the bucket that the nodes may read, write and list (e.g. \"runs/<run-id>\"); no leading or trailing slash, no wildcards."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*$", var.prefix))
    error_message = "prefix must be path segments of letters, digits and _.=- joined by single '/', without a leading or trailing '/' and without wildcards, e.g. \"runs/digits-20261122-073000-ab12\"."
  }
}

variable "bucket_kms_key_arn" {
  description = "ARN of the KMS key encrypting the bucket, when it uses SSE-KMS with a customer managed key; the nodes then get Encrypt/Decrypt/GenerateDataKey on it. Null for SSE-S3."
  type        = string
  default     = null

  validation {
    condition     = var.bucket_kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.bucket_kms_key_arn))
    error_message = "bucket_kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID), or null."
  }
}

variable "read_objects" {
  description = "Objects outside the run prefix the nodes may read (\"bucket/key\", e.g. a data set)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for o in var.read_objects : can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^*?]+(/\\*)?$", o))])
    error_message = "read_objects must be \"bucket/key\" strings, or \"bucket/prefix/*\" for every object under a prefix (no other wildcard), e.g. \"datasets/cifar-10-python.tar.gz\" or \"datasets/imagenet/*\"."
  }
}

variable "ssm_access" {
  description = "Let operators open Session Manager shells on nodes (no SSH port, no key pair): an inline policy with Session Manager's channels only, not AmazonSSMManagedInstanceCore (which reads every SSM parameter of the account)."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags added to every resource of this module."
  type        = map(string)
  default     = {}
}
