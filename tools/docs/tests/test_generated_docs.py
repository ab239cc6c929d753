"""The generated docs (tools/docs): current, faithful to the template however it is written, and true to
the events the domain really builds."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs in .venv; only validates here
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from shop.adapters.dynamodb.inventory_repository import DynamoInventoryRepository
from shop.adapters.dynamodb.order_repository import DynamoOrderRepository
from shop.domain.envelope import CloudEvent
from shop.domain.event_types import EVENT_TYPES
from shop.domain.inventory import InventoryService
from shop.domain.orders import OrderLine, OrderService, PlaceOrder
from shop.domain.saga import OrderStatusPolicy
from shop.runtime.config import Settings
from tools.docs import cfn, pages, reference
from tools.docs.cfn import ExpandedTemplate
from tools.docs.domain import ROOT
from tools.template import Template


@pytest.fixture(scope="module")
def expanded() -> ExpandedTemplate:
    return ExpandedTemplate.load()


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(pages.ASYNCAPI.read_text())
    return loaded


# --- currency ------------------------------------------------------------------------------------------
def test_committed_docs_are_what_the_generator_writes(expanded: ExpandedTemplate) -> None:
    for path, text in pages.expected(expanded).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: run `make docs`"


def test_a_changed_table_cell_is_put_back_and_prose_is_kept(expanded: ExpandedTemplate) -> None:
    page = pages.REFERENCE.read_text()
    edited = page.replace("`AWS::SQS::Queue`: The Inventory consumer's queue.", "`AWS::SQS::Queue`: a queue.")
    edited = edited.replace(
        "Each function has its own execution role", "Each function has its OWN execution role"
    )
    assert edited != page
    regenerated = pages.generators(expanded)[pages.REFERENCE](edited)
    assert "`AWS::SQS::Queue`: The Inventory consumer's queue." in regenerated
    assert "its OWN execution role" in regenerated  # prose outside the markers is the page's own


# --- the template's repeated blocks and attached role policies --------------------------------------
def test_each_consumers_resources_are_documented_one_by_one(expanded: ExpandedTemplate) -> None:
    table = reference.resources_table(expanded)
    for consumer in ("Inventory", "OrderStatus", "Notification"):
        for suffix in ("Queue", "DeadLetterQueue", "QueuePolicy", "Rule", "Function", "FunctionRole"):
            assert f"| `{consumer}{suffix}` |" in table


@pytest.mark.parametrize("store", ["dynamodb", "postgres"])
def test_role_policy_statements_are_listed_under_their_role(expanded: ExpandedTemplate, store: str) -> None:
    variant = expanded.variants()[store]
    policies = [name for name in variant.of_type("AWS::IAM::RolePolicy") if variant.is_created(name)]
    assert policies, "each function's own access is written as role policies"
    for name in policies:
        role = cfn.reference(variant.properties(name)["RoleName"])
        function = next(f for f in variant.functions() if variant.role_of(f) == role)
        permissions = variant.permissions(function)
        # an effect policy holds what the code calls; a source policy may hold what Lambda uses too
        listed = permissions.code if name.endswith("EffectPolicy") else permissions.code | permissions.runtime
        for statement in cfn.as_list(variant.properties(name)["PolicyDocument"]["Statement"]):
            for action in cfn.as_list(statement["Action"]):
                for resource in cfn.as_list(statement["Resource"]):
                    assert (action, cfn.resource_of(resource, name)) in listed, (name, action, resource)


def test_each_order_store_is_documented_with_what_exists_only_for_it(expanded: ExpandedTemplate) -> None:
    assert list(expanded.variants()) == ["dynamodb", "postgres"]  # the default first
    stores: dict[str, list[str]] = {}
    for row in reference.permissions_table(expanded).splitlines()[2:]:
        function, values = row.strip("|").split("|")[:2]
        stores.setdefault(function.split("`")[1], []).extend(v.strip(" `") for v in values.split(","))
    # a function the postgres store alone creates has one row, for it, with what it is granted there
    assert stores["OutboxPublisherFunction"] == ["postgres"]
    assert stores["OrdersApiFunction"] == ["dynamodb", "postgres"]  # granted differently by each
    postgres = expanded.variants()["postgres"]
    assert ("events:PutEvents", "EventBus") in postgres.permissions("OutboxPublisherFunction").code
    # and each resource it alone creates is described from the expansion that creates it
    assert (
        "| `OutboxPublisherLogGroup` | `AWS::Logs::LogGroup`: Log group of `OutboxPublisherFunction` "
        "(only when `UsePostgres`). |"
    ) in reference.resources_table(expanded)


# --- the events the domain builds ----------------------------------------------------------------------
class Recording:
    """A repository that remembers every event it has written (a failed write's event is not emitted)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.events: list[CloudEvent] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._real, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            self.events.extend(a for a in (*args, *kwargs.values()) if isinstance(a, CloudEvent))
            return result

        return call


def emitted_by_the_saga(template: Template, monkeypatch: pytest.MonkeyPatch) -> list[CloudEvent]:
    """Every path of the saga once: an order confirmed then cancelled, and an order rejected."""
    monkeypatch.setenv("ORDERS_TABLE_NAME", template.physical_name("OrdersTable"))
    monkeypatch.setenv("INVENTORY_TABLE_NAME", template.physical_name("InventoryTable"))
    settings = Settings.from_env()
    order_store = Recording(DynamoOrderRepository(settings))
    stock_store = Recording(DynamoInventoryRepository(settings))
    stock_store.set_stock("SKU-RED-MUG", 5)
    order_service = OrderService(order_store, settings)
    stock = InventoryService(stock_store)
    status = OrderStatusPolicy(order_service)

    def place(quantity: int) -> CloudEvent:
        order_service.place_order(
            PlaceOrder("c-1", "USD", (OrderLine("SKU-RED-MUG", quantity, 1250),)),
            idempotency_key=None,
            correlation_id=f"corr-{quantity}",
        )
        return order_store.events[-1]

    created = place(2)
    stock.apply(created)  # InventoryReserved
    status.apply(stock_store.events[-1])  # OrderConfirmed
    order_service.cancel_order(created.subject, correlation_id="corr-cancel")
    stock.apply(order_store.events[-1])  # InventoryReleased
    stock.apply(place(50))  # more than the stock: InventoryRejected
    status.apply(stock_store.events[-1])  # OrderRejected
    return order_store.events + stock_store.events


def payload_validator(document: dict[str, Any], message: str) -> jsonschema.Draft7Validator:
    """A validator of one message's payload, resolving the document's own $refs."""
    registry: Registry[Any] = Registry().with_resource(
        "urn:asyncapi", Resource.from_contents(document, default_specification=DRAFT7)
    )
    return jsonschema.Draft7Validator(
        {"$ref": f"urn:asyncapi#/components/messages/{message}/payload"},
        registry=registry,
        format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER,
    )


def test_every_event_the_domain_emits_has_a_message_its_envelope_validates_against(
    aws: None, template: Template, monkeypatch: pytest.MonkeyPatch, document: dict[str, Any]
) -> None:
    events = emitted_by_the_saga(template, monkeypatch)
    messages = document["components"]["messages"]
    assert {e.type for e in events} == {t.name for t in EVENT_TYPES} == set(messages)
    for event in events:
        envelope = json.loads(event.to_json())
        payload_validator(document, event.type).validate(envelope)


def events_page_prose() -> str:
    """docs/events.md less its generated table: what people wrote, which no generator keeps current."""
    page = pages.EVENTS.read_text()
    return page[: page.index("<!-- events:start -->")] + page[page.index("<!-- events:end -->") :]


def test_the_events_page_names_every_envelope_attribute_the_domain_emits(
    aws: None, template: Template, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Traced as the repositories store them (a write in Lambda carries a trace header).
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    emitted = {
        name
        for event in emitted_by_the_saga(template, monkeypatch)
        for name in event.traced(header).to_dict()
    }
    named = set(re.findall(r"`([a-z0-9]+)`", events_page_prose()))

    assert {"causationid", "traceparent"} <= emitted  # the optional ones too
    assert emitted - named == set()


def test_every_source_file_the_events_page_names_exists() -> None:
    named = set(re.findall(r"`(shop/[\w/]+\.py)`", pages.EVENTS.read_text()))

    assert "shop/domain/envelope.py" in named
    assert {path for path in named if not (ROOT / "layers" / "shared" / path).is_file()} == set()


def test_message_schemas_refuse_what_the_domain_does_not_send(
    aws: None, template: Template, monkeypatch: pytest.MonkeyPatch, document: dict[str, Any]
) -> None:
    events = {e.type: json.loads(e.to_json()) for e in emitted_by_the_saga(template, monkeypatch)}
    created, rejected = events["OrderCreated"], events["InventoryRejected"]
    wrong: list[tuple[str, dict[str, Any]]] = [
        ("OrderCreated", {**created, "data": {k: v for k, v in created["data"].items() if k != "currency"}}),
        ("OrderCreated", {**created, "data": {**created["data"], "discount": 5}}),
        ("OrderCreated", {**created, "source": "shop.inventory"}),
        ("OrderCreated", {**created, "sequence": 0}),
        ("OrderCreated", {k: v for k, v in created.items() if k != "correlationid"}),
        ("OrderCreated", {**created, "Trace-Id": "x"}),  # not a CloudEvents attribute name
        ("OrderCreated", {**created, "trace": {"id": "x"}}),  # not a CloudEvents attribute type
        ("OrderCreated", {**created, "data_base64": "AAAA"}),
        ("OrderConfirmed", created),
        ("InventoryRejected", {**rejected, "data": {**rejected["data"], "shortSkus": []}}),
        ("InventoryReserved", {**rejected, "type": "InventoryReserved"}),  # a reason it does not carry
    ]
    for message, envelope in wrong:
        assert not payload_validator(document, message).is_valid(envelope), (message, envelope)


def test_the_envelope_schema_admits_extension_attributes_it_does_not_list(
    aws: None, template: Template, monkeypatch: pytest.MonkeyPatch, document: dict[str, Any]
) -> None:
    """CloudEvents lets a producer add extensions (and this one added traceparent after 1.0.0): a consumer
    validating against the document must not refuse an event for one."""
    events = {e.type: json.loads(e.to_json()) for e in emitted_by_the_saga(template, monkeypatch)}
    created = events["OrderCreated"]

    for extension in ({"partitionkey": "o-1"}, {"retries": 2}, {"replayed": True}):
        payload_validator(document, "OrderCreated").validate({**created, **extension})


def inlined(schema: Any, schemas: dict[str, Any]) -> Any:
    """A schema with its #/components/schemas/ references replaced by what they name, descriptions dropped."""
    if isinstance(schema, dict):
        if set(schema) == {"$ref"}:
            return inlined(schemas[schema["$ref"].rsplit("/", 1)[1]], schemas)
        return {k: inlined(v, schemas) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [inlined(v, schemas) for v in schema]
    return schema


def test_order_events_carry_the_apis_order_representation(document: dict[str, Any]) -> None:
    api_schemas = json.loads((ROOT / "tools" / "docs" / "openapi.json").read_text())["components"]["schemas"]
    event_schemas = document["components"]["schemas"]
    assert inlined(event_schemas["OrderData"], event_schemas) == inlined(api_schemas["Order"], api_schemas)


def test_each_rule_receives_the_messages_its_pattern_selects(
    expanded: ExpandedTemplate, document: dict[str, Any]
) -> None:
    received = {
        name: [m["$ref"].rsplit("/", 1)[1] for m in op["messages"]]
        for name, op in document["operations"].items()
        if op["action"] == "receive"
    }
    assert set(received) == set(expanded.rules_on_bus())
    for rule, names in received.items():
        pattern = expanded.properties(rule)["EventPattern"]
        for name in names:
            message = document["components"]["messages"][name]
            assert message["x-eventbridge"]["source"] in pattern["source"], (rule, name)
            assert name in pattern["detail-type"], (rule, name)
    [send] = [op for op in document["operations"].values() if op["action"] == "send"]
    assert len(send["messages"]) == len(EVENT_TYPES)
