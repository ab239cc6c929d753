"""Reading the template: template.yaml as SAM CLI reads it (loop expansion, Globals, intrinsics) and the
built artefacts of `sam build`.

Everything else in tools.local learns what to run from here. Imports: the standard library, SAM CLI's
own reader and nothing else of tools.local.
"""
