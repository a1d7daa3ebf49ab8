output "bucket" {
  description = "Name of the results bucket."
  value       = module.storage.bucket
}

output "bucket_arn" {
  description = "ARN of the results bucket."
  value       = module.storage.bucket_arn
}
