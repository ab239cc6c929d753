"""Domain package shared by every function: orders, inventory, the outbox and its key design.

Nothing in here knows about Lambda events; handlers translate events into calls on this package.
"""
