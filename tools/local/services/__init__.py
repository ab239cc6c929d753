"""The emulated AWS services: DynamoDB Local (Java, from npm) and moto's server (EventBridge, SQS, SNS),
the template's resources provisioned in them, and the watch on its SNS topics.

Imports: tools.template, tools.local.processes and tools.local.console.activity (to record what
the topics publish); never the runtime, pollers or gateway.
"""
