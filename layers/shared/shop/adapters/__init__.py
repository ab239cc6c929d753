"""Adapters: the world behind the domain's Protocols. The two order stores stand side by side, neither
importing the other (tests/unit/test_architecture.py):
- dynamodb/: the DynamoDB repositories, the key design (dynamodb.keys, the only module that builds PK/SK
  and index key strings), the outbox item format and the transactions that ride out contention;
- postgres/: the PostgreSQL order store, the only package with SQL in it.
Beside them, the store-neutral AWS adapters: the EventBridge publisher and its PutEvents transport over
the AWS Common Runtime (eventbridge_crt), the SNS notification channel, the relay's poison queue with its
message codec, and the lazily created AWS clients.

Imports: shop.domain, boto3/botocore, awscrt (eventbridge_crt only, loaded on first use) and the standard
library; never shop.runtime. Settings arrive as
arguments (objects matching the Protocols declared next to their use), never from the environment.
"""
