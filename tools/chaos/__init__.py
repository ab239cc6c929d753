"""Fault injection across every boundary of the pipeline, with the invariants checked after it drains.

`make chaos` (python -m tools.chaos) starts the local stack with faults.py preloaded in every function
worker (LOCAL_WORKER_PRELOAD), drives orders over HTTP, injects poison pills and bus duplicates from the
harness, waits for the pipeline to drain and checks: nothing lost, nothing phantom, every effect once.
"""
