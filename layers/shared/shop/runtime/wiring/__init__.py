"""The functions' composition root: domain services on their AWS adapters, built from settings.

One module per service, so a function imports the adapters it uses and no others (each unused adapter
cost its function's cold start 1-2 ms). Repositories written to from Lambda carry the invocation's
X-Ray trace header into each outbox item.
"""
