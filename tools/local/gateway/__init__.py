"""The local API Gateway: serves the template's API routes on 127.0.0.1:3000 and invokes the API function
with API Gateway's proxy event, with a local IAM caller identity; on the same port, Lambda's Invoke API
for every function of the stack (lambda_api.py).

Imports: tools.template, tools.local.runtime, tools.local.pollers (route listing), tools.local.processes
and tools.local.console.activity (each invocation is recorded).
"""
