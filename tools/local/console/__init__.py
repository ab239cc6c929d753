"""What a person sees: the activity log of every invocation and hop, the start-up summary and the
rendering of each event flowing through relay and consumers.

Imports: tools.template, the runtime's result types, the pollers' settings (for the summary) and
tools.local.supervision (the printer is a supervised thread).
"""
