"""template.yaml as SAM CLI reads it (loop expansion, Globals, intrinsics), and as CloudFormation processes
it for given parameters (translate): tools/template/README.md.

The one reader of the template for the product's tests and for every tool (the local stack, chaos,
bench). Imports: the standard library and SAM CLI's own code (with samtranslator and boto3, which it
brings); nothing else of tools/, so the product's unit tests can read the template without the local
stack.
"""

from tools.template.intrinsics import chosen
from tools.template.reader import (
    ACCOUNT,
    REGION,
    ROOT,
    TEMPLATE_PATH,
    FunctionSpec,
    Template,
    TemplateError,
    load_yaml,
    parse_yaml,
)

__all__ = [
    "ACCOUNT",
    "REGION",
    "ROOT",
    "TEMPLATE_PATH",
    "FunctionSpec",
    "Template",
    "TemplateError",
    "chosen",
    "load_yaml",
    "parse_yaml",
]
