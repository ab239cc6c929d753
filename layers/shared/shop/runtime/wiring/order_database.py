"""The order database (OrderStore=postgres): one connection per process, its password from the Secrets
Manager secret Aurora manages and rotates (through Powertools' parameters, cached for 5 minutes and
fetched again when the database refuses it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from shop.adapters.postgres.connection import ConnectionSettings, Database
from shop.runtime.config import Settings

SECRET_MAX_AGE_SECONDS = 300


def _secret_password(secret_arn: str) -> Callable[[bool], str | None]:
    def password(refresh: bool) -> str | None:
        from aws_lambda_powertools.utilities.parameters import get_secret  # only this store needs it

        secret = get_secret(secret_arn, transform="json", max_age=SECRET_MAX_AGE_SECONDS, force_fetch=refresh)
        return str(secret["password"])

    return password


def _no_password(refresh: bool) -> str | None:
    return None  # locally: trust authentication on the server's Unix socket


def connection_settings(settings: Settings) -> ConnectionSettings:
    return ConnectionSettings(
        host=settings.require("database_host"),
        port=settings.database_port,
        dbname=settings.database_name,
        user=settings.database_user,
        password=_secret_password(settings.database_secret_arn)
        if settings.database_secret_arn
        else _no_password,
    )


@cache
def order_database(settings: Settings) -> Database:
    return Database(connection_settings(settings))
