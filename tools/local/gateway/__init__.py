"""The local API Gateway: serves the template's API routes on 127.0.0.1:3000 and invokes the API function
with API Gateway's proxy event, with a local IAM caller identity.

Imports: tools.template, tools.local.runtime, tools.local.pollers (route listing) and
tools.local.processes.
"""
