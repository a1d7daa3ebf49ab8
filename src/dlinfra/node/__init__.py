"""The node agent: the one program every node runs, on a laptop or on EC2 (cf. SkyPilot's skylet).

It knows nothing of targets or Terraform: it reads its node.json, talks to TensorFlow and to the
store, and reports status.
"""
