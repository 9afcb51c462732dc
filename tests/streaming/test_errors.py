"""streaming.errors: the one root and the one-line form of any failure."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from streaming.errors import ONE_LINE_MAX, BitrouteError, one_line


def test_delta_rs_causes_join_without_colours_or_debug_source():
    exc = OSError("\x1b[31mGeneric S3 error\x1b[0m: put failed\n  ↳ HTTP status 403\n  ↳ Forbidden\n\n"
                  "Debug source:\nInternal { secret: ... }")
    assert one_line(exc) == "Generic S3 error: put failed: HTTP status 403: Forbidden"


def test_a_spark_message_keeps_its_first_line_only():
    exc = RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] The table `x` cannot be found.\n"
                       "== SQL (line 1, position 15) ==\nSELECT * FROM x\n\nJVM stacktrace:\n\tat org.Foo")
    assert one_line(exc) == "[TABLE_OR_VIEW_NOT_FOUND] The table `x` cannot be found."


def test_a_python_traceback_wrapped_by_spark_gives_its_raising_line():
    text = ("An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
            '  File "/x/service.py", line 1, in call\n'
            "pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED] terminated\n"
            "streaming.router.subscriptions.changelog.ChangelogError: changelog 'subs' ends at 3\n")
    assert one_line(RuntimeError(text)) == ("streaming.router.subscriptions.changelog.ChangelogError: "
                                            "changelog 'subs' ends at 3")


def test_a_kafka_exception_is_its_kafka_error_text():
    error = KafkaError(KafkaError._TRANSPORT, "broker down")
    assert one_line(KafkaException(error)) == "broker down"


def test_typed_names_the_type_and_an_empty_message_falls_back_to_it():
    assert one_line(OSError("disk full"), typed=True) == "OSError: disk full"
    assert one_line(ValueError()) == "ValueError"
    assert one_line(ValueError(), typed=True) == "ValueError"
    assert one_line("") == "no reason given"
    assert one_line(None) == "no reason given"


def test_the_line_is_bounded_and_single():
    line = one_line(BitrouteError("x" * 2000 + "\nsecond line"))
    assert len(line) == ONE_LINE_MAX and "\n" not in line


def test_every_exception_streaming_raises_is_in_an_errors_module_under_the_one_root():
    """One exceptions module per package (streaming/errors.py, streaming/<package>/errors.py),
    every public exception class a BitrouteError; the modules that raise them re-export them."""
    import importlib
    import inspect
    import pkgutil

    import streaming
    from streaming.state.errors import RouterLockedError as home
    from streaming.state.lock import RouterLockedError

    misplaced = []
    for info in pkgutil.walk_packages(streaming.__path__, "streaming."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == info.name and not name.startswith("_")):
                if not info.name.endswith(".errors") or not issubclass(value, BitrouteError):
                    misplaced.append(f"{info.name}.{name}")
    assert misplaced == []
    assert RouterLockedError is home
