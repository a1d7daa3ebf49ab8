output "instance_id" {
  description = "The controller's instance: started by `deploy` when a run is handed over, stopped by itself when idle."
  value       = aws_instance.this.id
}

output "role_name" {
  description = "The controller's IAM role (infra/modules/controller_iam)."
  value       = module.iam.role_name
}

output "vpc_id" {
  description = "The controller's own VPC."
  value       = module.network.vpc_id
}
