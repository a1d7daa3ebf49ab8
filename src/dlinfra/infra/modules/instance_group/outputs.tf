output "instances" {
  description = "Instances of this role keyed by node name: { id, private_ip }. Never carries user data."
  value = {
    for node, instance in aws_instance.this : node => {
      id         = instance.id
      private_ip = instance.private_ip
    }
  }
}

output "placement_group" {
  description = "Name of the role's cluster placement group, or null."
  value       = one(aws_placement_group.this[*].name)
}
