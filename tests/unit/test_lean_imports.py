"""shop.runtime.lean_imports: Powertools packages load only what is used, and still give what they export.

Each check runs in a fresh interpreter: in this one Powertools is imported already, so nothing is deferred.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shop.runtime.lean_imports import POWERTOOLS_PACKAGES, reexports
from tools.template import ROOT


def fresh_interpreter(code: str) -> dict[str, object]:
    """Run `code` after `import shop.runtime` (as every function does); it prints a JSON object."""
    result = subprocess.run(
        [sys.executable, "-c", f"import shop.runtime\n{code}"],
        env={"PYTHONPATH": str(ROOT / "layers" / "shared"), "AWS_DEFAULT_REGION": "us-east-1"},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    loaded: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def test_the_consumers_batch_utility_loads_one_event_class_not_all_of_them():
    seen = fresh_interpreter(
        "import sys, json\n"
        "from aws_lambda_powertools.utilities.batch import BatchProcessor, process_partial_response\n"
        "print(json.dumps({m: m in sys.modules for m in [\n"
        "    'aws_lambda_powertools.utilities.data_classes.sqs_event',\n"
        "    'aws_lambda_powertools.utilities.data_classes.kinesis_firehose_event',\n"
        "    'aws_lambda_powertools.utilities.data_classes.code_pipeline_job_event']}))\n"
    )
    assert seen == {
        "aws_lambda_powertools.utilities.data_classes.sqs_event": True,
        "aws_lambda_powertools.utilities.data_classes.kinesis_firehose_event": False,
        "aws_lambda_powertools.utilities.data_classes.code_pipeline_job_event": False,
    }


def test_the_apis_resolver_loads_without_the_other_resolvers():
    seen = fresh_interpreter(
        "import sys, json\n"
        "from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types\n"
        "from aws_lambda_powertools.event_handler import api_gateway\n"
        "print(json.dumps({\n"
        "    'same objects': Response is api_gateway.Response and APIGatewayRestResolver is api_gateway.APIGatewayRestResolver,\n"  # noqa: E501
        "    'content_types is the module': content_types.APPLICATION_JSON == 'application/json',\n"
        "    'appsync': 'aws_lambda_powertools.event_handler.appsync' in sys.modules,\n"
        "    'openapi merge': 'aws_lambda_powertools.event_handler.openapi.merge' in sys.modules,\n"
        "    'asyncio': 'asyncio.base_events' in sys.modules}))\n"
    )
    assert seen == {
        "same objects": True,
        "content_types is the module": True,
        "appsync": False,
        "openapi merge": False,
        "asyncio": False,
    }


def test_openapis_reexports_still_resolve_when_used():
    seen = fresh_interpreter(
        "import sys, json\n"
        "from aws_lambda_powertools.event_handler import APIGatewayRestResolver\n"
        "from aws_lambda_powertools.event_handler.openapi import OpenAPIMerge\n"
        "from aws_lambda_powertools.event_handler.openapi.merge import OpenAPIMerge as Defined\n"
        "print(json.dumps({'same object': OpenAPIMerge is Defined}))\n"
    )
    assert seen == {"same object": True}


def test_asyncio_is_not_run_until_used_and_then_is_the_real_module():
    """The batch utility imports asyncio for its async processor; the consumers use the synchronous one."""
    seen = fresh_interpreter(
        "import sys, json\n"
        "from aws_lambda_powertools.utilities.batch import BatchProcessor, process_partial_response\n"
        "before = 'asyncio.base_events' in sys.modules\n"
        "from aws_lambda_powertools.utilities.batch import AsyncBatchProcessor, EventType\n"
        "from aws_lambda_powertools.utilities.batch import async_process_partial_response\n"
        "async def handle(record):\n"
        "    if record.body == 'bad':\n"
        "        raise ValueError(record.body)\n"
        "queue = 'arn:aws:sqs:us-east-1:1:q'\n"
        "event = {'Records': [{'messageId': m, 'body': m, 'attributes': {}, 'messageAttributes': {},\n"
        "    'eventSource': 'aws:sqs', 'eventSourceARN': queue} for m in ('ok', 'bad')]}\n"
        "response = async_process_partial_response(event, handle, AsyncBatchProcessor(EventType.SQS), None)\n"
        "import asyncio, asyncio.events\n"
        "from asyncio import gather\n"
        "print(json.dumps({'run before use': before, 'async batch response': response,\n"
        "    'real module': sys.modules['asyncio'].gather is gather is asyncio.gather}))\n"
    )
    assert seen == {
        "run before use": False,
        "async batch response": {"batchItemFailures": [{"itemIdentifier": "bad"}]},
        "real module": True,
    }


def test_logging_does_not_load_asyncio():
    """A log record asks asyncio for its task's name when asyncio is in sys.modules, as the stand-in is."""
    seen = fresh_interpreter(
        "import sys, json, io\n"
        "from aws_lambda_powertools import Logger\n"
        "out = io.StringIO()\n"
        "Logger(service='s', logger_handler=__import__('logging').StreamHandler(out)).info('a line')\n"
        "print(json.dumps({'logged': json.loads(out.getvalue())['message'],\n"
        "    'asyncio': 'asyncio.base_events' in sys.modules}))\n"
    )
    assert seen == {"logged": "a line", "asyncio": False}


def test_every_reexported_name_is_the_object_its_submodule_defines():
    """Including data_classes.event_source: a decorator, in a submodule of the same name."""
    seen = fresh_interpreter(
        "import json, importlib, inspect\n"
        "from shop.runtime.lean_imports import POWERTOOLS_PACKAGES, reexports\n"
        "import aws_lambda_powertools.utilities.data_classes.event_source\n"
        "wrong = []\n"
        "for name in POWERTOOLS_PACKAGES:\n"
        "    package = importlib.import_module(name)\n"
        "    source = open(package.__spec__.origin).read()\n"
        "    for export, (module, original) in reexports(source, name).items():\n"
        "        if getattr(package, export) is not getattr(importlib.import_module(module), original):\n"
        "            wrong.append(f'{name}.{export}')\n"
        "print(json.dumps({'wrong': wrong}))\n"
    )
    assert seen == {"wrong": []}


@pytest.mark.parametrize(
    "init_source",
    [
        "from .a import A\nset_handler()\n",  # a side effect: running the __init__ matters
        "from .a import *\n",  # names unknown without running it
        "import os\nPATH = os.getcwd()\n",
    ],
)
def test_a_package_whose_init_does_more_than_reexport_is_never_deferred(init_source: str):
    assert reexports(init_source, "pkg") is None


def test_the_deferred_packages_only_reexport():
    for name in POWERTOOLS_PACKAGES:  # as installed here: the version the layer pins
        spec = importlib.util.find_spec(name)
        assert spec is not None
        assert spec.origin is not None
        assert reexports(Path(spec.origin).read_text(), name), name
