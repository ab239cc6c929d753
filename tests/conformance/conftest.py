"""Conformance layer: the local stack's event sources checked against what AWS documents, case by case,
and the publisher's awscrt PutEvents transport against the SDK (test_put_events_transport.py).

It runs on the integration layer's local stack: `local_services` and `probe_stack` (template.yaml plus
tests/integration/probe/fragment.yaml) are defined in tests/conftest.py, so a session that runs both
layers starts one DynamoDB Local, one moto server and one probe stack.
"""
