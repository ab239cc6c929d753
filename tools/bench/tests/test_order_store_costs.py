"""The two order stores' costs (tools/bench/cost_model.py): what the postgres store stops paying, what it
pays instead, and where one gets cheaper than the other."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench import cost_model


def _write(item: str, wcu: float) -> dict[str, Any]:
    return {"item": item, "wcu_aws": wcu}


def bench_figures(write_cpu_ms: float = 1.0) -> dict[str, Any]:
    consumer = {"wcu_aws": 4.0, "calls": {"GetItem": 1.0}, "writes": [_write("IdempotencyTable record", 4.0)]}
    return {
        "relay": {
            "ours": {"invocations_per_order_full_batches": 0.03, "cpu_ms_per_1000_events": 700.0},
            "baseline": {"invocations_per_order_full_batches": 0.05, "cpu_ms_per_1000_events": 4000.0},
        },
        "write_cost": {
            "create": {
                "wcu_aws": 10.0,
                "writes": [_write("OrdersTable order item", 2.0), _write("OrdersTable outbox item", 8.0)],
            },
            "consumers": {
                "inventory_consumer": consumer,
                "order_status_consumer": {
                    "wcu_aws": 12.0,
                    "calls": {"GetItem": 1.0},
                    "writes": [
                        _write("IdempotencyTable record", 2.0),
                        _write("OrdersTable order item", 10.0),
                    ],
                },
                "notification_consumer": consumer,
            },
        },
        "postgres_relays": {
            "polling": {
                "throughput": {
                    "orders": 100,
                    "events": 200,
                    "database_cpu_ms_per_event": 0.1,
                    "database_write_cpu_ms_per_order": write_cpu_ms,
                }
            },
            "logical": {
                "throughput": {
                    "orders": 100,
                    "events": 200,
                    "database_cpu_ms_per_event": 0.05,
                    "database_write_cpu_ms_per_order": write_cpu_ms,
                }
            },
        },
    }


def test_the_postgres_store_stops_paying_the_orders_tables_writes_and_pays_aurora_instead() -> None:
    bench = bench_figures()
    dynamodb = cost_model.cost_per_million_orders(bench, "ours")
    postgres = cost_model.postgres_cost_per_million_orders(bench)

    orders_table_wcu = 2.0 + 8.0 + 10.0
    price = cost_model.PRICES["dynamodb_write_request_unit_per_million"]
    assert dynamodb["DynamoDB writes"] - postgres["DynamoDB writes"] == pytest.approx(
        orders_table_wcu * price
    )
    assert postgres["Aurora I/O"] > 0
    # CPU per order: writes 1.0 ms + 2 events x 0.1 ms = 1.2 ms -> ACU-seconds at a quarter vCPU per ACU.
    acu_seconds = 1.2 / 1000 / cost_model.VCPU_PER_ACU
    expected = 1_000_000 * acu_seconds / 3600 * cost_model.POSTGRES_PRICES["aurora_acu_hour"]
    assert postgres["Aurora capacity above the minimum"] == pytest.approx(expected)
    assert postgres["total"] == pytest.approx(sum(v for k, v in postgres.items() if k != "total"))


def test_the_break_even_is_the_fixed_cost_over_the_saving_per_order() -> None:
    bench = bench_figures()
    saving = (
        cost_model.cost_per_million_orders(bench, "ours")["total"]
        - cost_model.postgres_cost_per_million_orders(bench)["total"]
    )
    fixed = sum(cost_model.postgres_fixed_per_month().values())

    assert cost_model.break_even_orders_per_month(bench) == pytest.approx(fixed / saving * 1_000_000)


def test_no_break_even_when_the_database_costs_more_per_order() -> None:
    assert cost_model.break_even_orders_per_month(bench_figures(write_cpu_ms=10_000.0)) is None


def test_the_fixed_month_counts_every_endpoint_in_every_zone_and_the_always_polling_publisher() -> None:
    fixed = cost_model.postgres_fixed_per_month()
    assert fixed["VPC interface endpoints"] == pytest.approx(5 * 2 * 0.01 * 730)
    assert fixed["publisher Lambda (always polling)"] == pytest.approx(0.5 * 65 * 60 * 730 * 0.0000133334)


def test_the_logical_relay_is_priced_from_its_own_figures_and_pays_no_marking_write() -> None:
    bench = bench_figures()
    polling = cost_model.postgres_cost_per_million_orders(bench, "polling")
    logical = cost_model.postgres_cost_per_million_orders(bench, "logical")

    io_price = cost_model.POSTGRES_PRICES["aurora_io_per_million"]
    assert polling["Aurora I/O"] - logical["Aurora I/O"] == pytest.approx(io_price)  # no published_at mark
    # CPU per order: writes 1.0 ms + 2 events x 0.05 ms = 1.1 ms (polling: 1.2 ms).
    acu_hours = 1_000_000 * 1.1 / 1000 / cost_model.VCPU_PER_ACU / 3600
    expected = acu_hours * cost_model.POSTGRES_PRICES["aurora_acu_hour"]
    assert logical["Aurora capacity above the minimum"] == pytest.approx(expected)
    logical_even = cost_model.break_even_orders_per_month(bench, "logical")
    polling_even = cost_model.break_even_orders_per_month(bench, "polling")
    assert logical_even is not None
    assert polling_even is not None
    assert logical_even < polling_even
    table = "\n".join(cost_model.render_order_stores(bench))
    assert "| Item | dynamodb | postgres, polling | postgres, logical |" in table
    assert "Break-even with PostgresRelay=logical" in table
