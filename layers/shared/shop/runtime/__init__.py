"""The Lambda runtime side: configuration (runtime.config: every environment variable is read there),
observability (one logger, tracer and metrics instance), the consumers' Powertools batch + idempotency,
the outbox relay (it records metrics), and the wiring that builds services from settings.

Imports: shop.domain, shop.adapters, Powertools, boto3/botocore and the standard library.
"""

from shop.runtime.lean_imports import defer_powertools_package_inits

# Before any Powertools module is imported through this package: see runtime.lean_imports.
defer_powertools_package_inits()
