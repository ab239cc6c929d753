"""Generated documentation: what docs/ says about template.yaml and the bus events, derived, never copied.

`python -m tools.docs` (`make docs`) writes, `python -m tools.docs --check` exits 1 naming each stale file:

- docs/reference.md  the marked tables: resources by type with their purpose, outputs, and each
                     function's permissions, from template.yaml read through SAM CLI's
                     AWS::LanguageExtensions expansion (Fn::ForEach, conditions, parameter defaults),
                     once per OrderStore value (cfn.VARIANT_PARAMETER): permissions per store
- docs/asyncapi.yaml AsyncAPI 3.0: the bus as one channel, one message per event type (the CloudEvents
                     envelope of shop.domain.envelope, `data` from shop.domain.event_types), the relay's
                     send and each EventBridge rule's receive operation
- docs/events.md     the marked table of event types, their sources and the rules that receive them

Modules: cfn (the expanded template and what it grants), schema (TypedDict -> JSON Schema),
reference, asyncapi, pages (which file holds what), domain (the one place that imports `shop`), and
openapi: the API contract's OpenAPI document (tools/docs/openapi.json, from the order API's resolver;
`make docs` rewrites it and functions/orders_api/request_schemas.json, the fuzzer reads it).
tools/docs/tests/test_generated_docs.py checks that the committed files are what this package generates.
`make docs` runs two more, each `python -m tools.docs.<module>`: database_schema (docs/order-database.sql,
on tools/local's embedded PostgreSQL) and inspector_screenshot (docs/images/inspector*.png, from local
stacks of their own).
"""
