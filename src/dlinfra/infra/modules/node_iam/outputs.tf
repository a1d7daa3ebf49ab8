output "role_name" {
  description = "Name of the node IAM role."
  value       = aws_iam_role.this.name
}

output "role_arn" {
  description = "ARN of the node IAM role."
  value       = aws_iam_role.this.arn
}

output "instance_profile_name" {
  description = "Name of the instance profile to give every node. Available once the role's policies are attached, so nodes never boot with a half-built role."
  value       = aws_iam_instance_profile.this.name

  depends_on = [
    aws_iam_role_policy.run_prefix,
    aws_iam_role_policy.session_manager,
  ]
}

output "instance_profile_arn" {
  description = "ARN of the node instance profile."
  value       = aws_iam_instance_profile.this.arn
}
