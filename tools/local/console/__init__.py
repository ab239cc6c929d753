"""What a person sees: the activity log of every invocation and hop, the start-up summary and the
rendering of each event flowing through relay and consumers.

Imports: tools.template, the runtime's result types and the pollers' settings (for the summary).
"""
