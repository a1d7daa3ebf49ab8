variable "bucket" {
  description = "Name of the results bucket (globally unique). Long-lived: created once by `dlinfra setup`, never by a run's stack."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.bucket)) && !strcontains(var.bucket, "..")
    error_message = "bucket must be a valid S3 bucket name: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit."
  }
}

variable "force_destroy" {
  description = "Allow `terraform destroy` to delete a bucket that still holds objects. Off by default: results outlive every stack."
  type        = bool
  default     = false
}

variable "deny_insecure_transport" {
  description = "Attach a bucket policy denying every request made without TLS. Turn off only for an emulator served over plain http:// (moto, LocalStack), which enforces the policy but cannot offer TLS."
  type        = bool
  default     = true
}

variable "kms_key_arn" {
  description = "Customer managed KMS key for SSE-KMS (with an S3 bucket key); null keeps SSE-S3 (AES256)."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[0-9a-f-]+$", var.kms_key_arn))
    error_message = "kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID), or null for SSE-S3."
  }
}

variable "retention" {
  description = <<-EOT
    Lifecycle of the bucket's objects. S3 lifecycle filters match a literal key prefix or tags,
    never a pattern, so checkpoints (under runs/<run-id>/checkpoints/) are matched by the object
    tag checkpoint_tag that the store sets on checkpoint uploads; checkpoint_prefixes adds
    literal prefixes for stores laid out another way. Days set to 0 turn the noncurrent-version or checkpoint rule off;
    incomplete multipart uploads are always aborted.
  EOT
  type = object({
    noncurrent_version_days      = optional(number, 30)
    checkpoint_days              = optional(number, 14)
    checkpoint_tag               = optional(object({ key = string, value = string }), { key = "dlinfra:kind", value = "checkpoint" })
    checkpoint_prefixes          = optional(list(string), [])
    abort_incomplete_upload_days = optional(number, 7)
  })
  default = {}

  validation {
    condition = alltrue([
      for d in [var.retention.noncurrent_version_days, var.retention.checkpoint_days] :
      floor(d) == d && d >= 0 && d <= 36500
    ])
    error_message = "retention.noncurrent_version_days and checkpoint_days must be whole numbers between 0 (rule off) and 36500."
  }
  validation {
    condition     = floor(var.retention.abort_incomplete_upload_days) == var.retention.abort_incomplete_upload_days && var.retention.abort_incomplete_upload_days >= 1 && var.retention.abort_incomplete_upload_days <= 365
    error_message = "retention.abort_incomplete_upload_days must be a whole number between 1 and 365: unfinished uploads are always cleaned up."
  }
  validation {
    condition     = alltrue([for p in var.retention.checkpoint_prefixes : can(regex("^[^/*?][^*?]*/$", p))])
    error_message = "retention.checkpoint_prefixes must be literal key prefixes ending in '/', without wildcards or a leading '/', e.g. \"checkpoints/\"."
  }
}

variable "tags" {
  description = "Tags added to every resource of this module."
  type        = map(string)
  default     = {}
}
