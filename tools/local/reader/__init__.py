"""What the stack reads besides the template: the built artefacts of `sam build` and which tables a
function's role may write. The template itself is read by tools.template (SAM CLI's own reader).

Imports: the standard library and tools.template; nothing else of tools.local.
"""
