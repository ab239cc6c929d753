"""Domain package shared by every function, in three layers (tests/unit/test_architecture.py keeps them):

    shop.domain    the rules: orders, inventory, the saga, the event envelope, the outbox in domain terms,
                   and the interfaces (Protocols) of what the rules need from outside. Standard library only.
    shop.adapters  AWS behind those interfaces: DynamoDB repositories and the key design, the EventBridge
                   publisher, the SNS notifier, the poison queue, the clients. May import shop.domain.
    shop.runtime   what a Lambda process needs: configuration from the environment, logger/tracer/metrics,
                   Powertools batch + idempotency for consumers, the relay, and the wiring of the above.
                   May import shop.domain and shop.adapters.

Nothing in here knows about Lambda events; handlers translate events into calls on this package.
"""
