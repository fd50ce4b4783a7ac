"""Every error the API raises is exported from ``spark_receivers`` and listed in the docs."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import spark_receivers
from spark_receivers import errors

ROOT = Path(__file__).resolve().parent.parent

# Errors of the package that never reach a user, and why.
INTERNAL = {
    "spark_receivers.receivers.http_body.BadRequestError": (
        "raised and caught inside HttpReceiver: the client gets a 400 naming the bad line"
    ),
    "spark_receivers.receivers.http_body.RecordTooLongError": (
        "raised and caught inside HttpReceiver: the client gets a 413 naming the long line"
    ),
}


def error_classes(module) -> list[type]:
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, errors.SparkReceiversError)
        and obj.__module__ == module.__name__
    ]


def test_every_error_of_errors_py_is_exported():
    classes = error_classes(errors)
    assert len(classes) >= 14
    for cls in classes:
        assert cls.__name__ in spark_receivers.__all__, cls
        assert getattr(spark_receivers, cls.__name__) is cls


def test_no_error_class_hides_in_another_module():
    found = []
    for info in pkgutil.walk_packages(spark_receivers.__path__, "spark_receivers."):
        if info.name.endswith(".__main__"):  # running it is the command line itself
            continue
        module = importlib.import_module(info.name)
        if module is not errors:
            found += [f"{c.__module__}.{c.__qualname__}" for c in error_classes(module)]
    assert sorted(found) == sorted(INTERNAL), "define errors in errors.py and export them"


def test_the_docs_list_every_error():
    listed = (ROOT / "docs" / "errors.md").read_text()
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Errors") : readme.index("\n## ", readme.index("## Errors"))]
    for cls in error_classes(errors):
        assert f"| `{cls.__name__}` |" in listed, cls
        if cls is not errors.SparkReceiversError:
            assert f"`{cls.__name__}`" in section, cls


def test_error_families_are_also_the_builtin_errors_callers_expect():
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.OffsetError, ValueError)
    assert issubclass(errors.StateError, RuntimeError)
    assert issubclass(errors.MissingDependencyError, ImportError)
    assert spark_receivers.StreamingError is spark_receivers.context.StreamingError
