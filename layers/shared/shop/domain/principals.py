"""Who owns an Idempotency-Key: the stable identity of an authenticated caller.

API Gateway's IAM authorization names the caller by `userArn`, the ARN of the credentials that signed
the request (API Gateway developer guide, "Variables for data transformations": `$context.identity.*`).
For temporary credentials of a role that ARN is `arn:aws:sts::<account>:assumed-role/<role>/<session>`
(IAM user guide, "IAM identifiers"), and the session name changes with every EC2 instance, ECS task,
Lambda environment and credential refresh. A worker that retries from another task is the same caller,
so its keys must be found again: a role's sessions share one namespace, the role's (account + role name;
role names are unique in an account, and the assumed-role ARN carries no role path).

Identities of people behind one role are told apart where AWS names them beside the role: a Cognito
identity pool's identity (`cognitoIdentityId`). IAM users, federated users and the root user keep their
ARN as it is: it does not change between sessions.
"""

from __future__ import annotations

import re

# The caller of a request that carries no authenticated principal (an API with ApiAuthType=NONE):
# all such callers share this one Idempotency-Key namespace.
ANONYMOUS_CALLER = "anonymous"

_ASSUMED_ROLE = re.compile(
    r"^arn:(?P<partition>[^:]+):sts::(?P<account>\d{12}):assumed-role/(?P<role>[^/]+)/.+$"
)
# `caller` for role credentials is "<role unique id>:<session name>" (e.g. AROAEXAMPLE:i-0abc).
_ROLE_SESSION_CALLER = re.compile(r"^(?P<role_id>AROA[A-Z0-9]+):.+$")


def idempotency_caller(
    *,
    user_arn: str | None = None,
    caller: str | None = None,
    account_id: str | None = None,
    cognito_identity_id: str | None = None,
) -> str:
    """The identity whose namespace an Idempotency-Key lives in (see the module docstring).

    From API Gateway's `requestContext.identity` fields: `userArn`, else `caller`, else `accountId`;
    with none of them, ANONYMOUS_CALLER.
    """
    if user_arn:
        role = _ASSUMED_ROLE.match(user_arn)
        if role is None:
            return user_arn
        stable = f"arn:{role['partition']}:sts::{role['account']}:assumed-role/{role['role']}"
        return f"{stable}#cognito:{cognito_identity_id}" if cognito_identity_id else stable
    if caller:
        session = _ROLE_SESSION_CALLER.match(caller)
        return session["role_id"] if session else caller
    return account_id or ANONYMOUS_CALLER
