"""The function runtime: one worker process per function environment (forked from a warm fork server),
the Lambda context, and invocation with reserved concurrency and throttling.

Imports: tools.template, tools.local.services and tools.local.processes; never the pollers or the
gateway (they call in, not the other way round).
"""
