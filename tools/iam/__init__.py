"""IAM evaluation of the template as deployed: every call a function makes, and what AWS services do on
their own with its resources, decided as AWS decides (tools/iam/README.md).

Imports the standard library and tools.template (its reader and its translator), nothing else of
tools/ (the product's unit tests use it: tests/unit/test_architecture.py).
"""

from tools.iam.access import Access, missing_condition_keys, refusals
from tools.iam.calls import ResourceNames, Touch, UnknownResource, touches
from tools.iam.deployed import (
    DeployedTemplate,
    DeploymentError,
    deployed,
    local_names,
    partition_keys,
    resource_policies,
    role_policies,
)
from tools.iam.evaluation import Decision, Request, SimulatorError, Statement, decisions

__all__ = [
    "Access",
    "Decision",
    "DeployedTemplate",
    "DeploymentError",
    "Request",
    "ResourceNames",
    "SimulatorError",
    "Statement",
    "Touch",
    "UnknownResource",
    "decisions",
    "deployed",
    "local_names",
    "missing_condition_keys",
    "partition_keys",
    "refusals",
    "resource_policies",
    "role_policies",
    "touches",
]
