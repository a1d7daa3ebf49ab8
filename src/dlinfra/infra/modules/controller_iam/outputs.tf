output "role_name" {
  description = "Name of the controller IAM role."
  value       = aws_iam_role.this.name
}

output "role_arn" {
  description = "ARN of the controller IAM role."
  value       = aws_iam_role.this.arn
}

output "instance_profile_name" {
  description = "Name of the instance profile to give the controller instance. Available once the role's policy is attached."
  value       = aws_iam_instance_profile.this.name

  depends_on = [aws_iam_role_policy.run_stacks]
}
