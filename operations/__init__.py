"""What an operator runs against a stack, from a checkout: redrive, replay, seed (`python -m operations`).

Not part of any Lambda artefact: the functions never redrive or replay. It uses the domain package
(`shop`, the shared layer's source) for the outbox contract, the publisher and the key design, so a
republished event is byte for byte what the relay would have sent.
"""
