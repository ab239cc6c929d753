"""The order database (OrderStore=postgres): one connection per process, its password from the Secrets
Manager secret Aurora manages and rotates (through Powertools' parameters, cached for 5 minutes and
fetched again when the database refuses it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, cast

from shop.adapters import aws
from shop.adapters.postgres.connection import ConnectionSettings, Database, PasswordUnavailable
from shop.runtime.config import Settings
from shop.runtime.observability import logger

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.parameters import SecretsProvider
    from mypy_boto3_secretsmanager import SecretsManagerClient

SECRET_MAX_AGE_SECONDS = 300


@lru_cache(maxsize=1)
def _secrets(client: SecretsManagerClient) -> SecretsProvider:
    """Powertools' provider (its cache of the secret) on the adapters' Secrets Manager client, whose
    timeouts fit the API's (its default provider's client waits up to a minute per attempt); a new one
    whenever the clients are made again (aws.reset_clients)."""
    from aws_lambda_powertools.utilities.parameters import SecretsProvider  # only this store needs it

    return SecretsProvider(boto3_client=client)


def _secret_password(secret_arn: str) -> Callable[[bool], str | None]:
    def password(refresh: bool) -> str | None:
        from aws_lambda_powertools.utilities.parameters import GetParameterError

        try:
            secret = _secrets(aws.secrets_manager()).get(
                secret_arn, transform="json", max_age=SECRET_MAX_AGE_SECONDS, force_fetch=refresh
            )
        except GetParameterError as exc:  # every failure of the call (throttled, timed out, unreachable)
            logger.warning("order database password not fetched", extra={"error": str(exc)[:500]})
            raise PasswordUnavailable(str(exc)) from exc
        return str(cast("dict[str, Any]", secret)["password"])  # transform="json": Aurora's is an object

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
