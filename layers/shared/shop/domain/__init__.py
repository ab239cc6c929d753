"""The domain: order and inventory rules, the saga, the CloudEvents envelope, errors, the outbox in domain
terms (what may be written, the entry it becomes on the bus) and the poison-record model.

Imports: the standard library and other shop.domain modules only. What the rules need from outside
(repositories, the publisher, the notification channel, the poison sink, settings values) is declared
here as a typing.Protocol and injected by the caller, so every rule runs without AWS.

The values every function builds (an order and its lines, a request record, a reservation, the envelope,
an outbox entry, a trace context) are typing.NamedTuples: immutable and compared by value, as frozen
dataclasses are, but defined without compiling generated methods at import, which cost a frozen dataclass
0.3-1 ms of each cold start (docs/performance.md, "Cold start"). Being tuples, they leave a function only
through their to_dict() or to_json(), never as they are.
"""
