"""The docker-free local stack: provisions and wires the pipeline from template.yaml."""
