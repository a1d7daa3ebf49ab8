output "bucket" {
  description = "Name of the results bucket."
  value       = aws_s3_bucket.this.bucket
}

output "bucket_arn" {
  description = "ARN of the results bucket."
  value       = aws_s3_bucket.this.arn
}

output "sse_algorithm" {
  description = "Default server-side encryption of the bucket: \"AES256\" or \"aws:kms\"."
  value       = local.sse_algorithm
}

output "deny_insecure_transport" {
  description = "Whether the bucket policy denying requests without TLS is attached."
  value       = length(aws_s3_bucket_policy.tls_only) == 1
}
