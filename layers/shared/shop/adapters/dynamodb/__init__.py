"""The order and inventory stores on DynamoDB: everything that knows DynamoDB keys, items and transactions.

- keys: the key design of every table, the only module that builds PK/SK and index key strings;
- outbox_items: the outbox item contract (written in the writer's transaction, read from the stream);
- transactions: TransactWriteItems ridden through contention with one ClientRequestToken, error mapping;
- order_repository, inventory_repository: shop.domain's repositories, one transaction per change.

Imports nothing of shop.adapters.postgres (tests/unit/test_architecture.py).
"""
