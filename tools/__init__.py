"""Tooling around the product, apart from it: nothing under tools/ ships in a Lambda artefact.

- tools.template  template.yaml read through SAM CLI's own code: the one reader, for the tests and tools
- tools.local  the docker-free local stack built from template.yaml (`make local`, the test stacks)
- tools.chaos  fault injection, invariants, recovery scenarios, API fuzzing (`make chaos`, `make fuzz`)
- tools.bench  relay efficiency, latency, cold start, write cost (`make bench`)
- tools.docs   reference tables, events table and AsyncAPI document, generated (`make docs`)

tools.chaos, tools.bench and tools.docs drive tools.local; tools.local imports nothing of theirs.
tools.template imports nothing of tools/. No module outside tests/ imports tests/ (test code: pytest's
conftest.py files and the tests/ folders), and tools/ has no import circle
(tests/unit/test_architecture.py).
"""
