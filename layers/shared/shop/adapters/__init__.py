"""Adapters: AWS behind the domain's Protocols. DynamoDB repositories, the key design (adapters.keys, the
only module that builds PK/SK and index key strings) and the outbox item format, the EventBridge
publisher, the SNS notification channel, the relay's poison queue, and the lazily created AWS clients.

Imports: shop.domain, boto3/botocore and the standard library; never shop.runtime. Settings arrive as
arguments (objects matching the Protocols declared next to their use), never from the environment.
"""
