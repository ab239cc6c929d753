"""Domain package shared by every function, in three layers (tests/unit/test_architecture.py keeps them):

    shop.domain    the rules: orders, inventory, the saga, the event envelope, the outbox in domain terms,
                   and the interfaces (Protocols) of what the rules need from outside. Standard library only.
    shop.adapters  the world behind those interfaces: the two order stores side by side (dynamodb/: the
                   DynamoDB repositories, the key design and the outbox item; postgres/: the PostgreSQL
                   order store and all SQL), and the store-neutral AWS adapters (the EventBridge
                   publisher, the SNS notifier, the poison queue and its message, the clients).
                   May import shop.domain.
    shop.runtime   what a Lambda process needs: configuration from the environment, logger/tracer/metrics,
                   Powertools batch + idempotency for consumers, the relay, and the wiring of the above.
                   May import shop.domain and shop.adapters.

Nothing in here knows about Lambda events; handlers translate events into calls on this package.
"""
