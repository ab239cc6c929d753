"""The event source mappings as AWS documents them: stream pollers (batches, bisect, retries, record age,
ParallelizationFactor, OnFailure), SQS pollers (batches, partial responses, throttling), FilterCriteria,
checkpoints and OnFailure destinations. Each behaviour cites its AWS page; tests/conformance checks it.

Imports: tools.template, tools.local.runtime, tools.local.console.activity,
tools.local.services.raw_json (the responses' JSON as it arrived, for the records handed to functions) and
tools.local.supervision (each poller is a supervised thread).
"""
