"""The event source mappings as AWS documents them: stream pollers (batches, bisect, retries, record age,
ParallelizationFactor, OnFailure), SQS pollers (batches, partial responses, throttling), FilterCriteria,
checkpoints and OnFailure destinations. Each behaviour cites its AWS page; tests/conformance checks it.

Imports: tools.template, tools.local.runtime and tools.local.console.activity.
"""
