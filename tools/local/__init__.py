"""The docker-free local stack: provisions and wires the pipeline from template.yaml.

Rooms: reader (the template and artefacts), services (DynamoDB Local, moto server, provisioning),
runtime (function workers), pollers (event source mappings), gateway (the local API), console (what a
person sees). stack.py assembles them, __main__.py and invoke.py are the entry points (`make local`,
`make invoke`), processes.py owns child processes and ports for all of them.
"""
