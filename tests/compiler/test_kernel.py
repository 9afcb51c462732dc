"""The kernel's Python face: its tables as one structure, its typed errors,
its stub, and what the matcher does when the kernel refuses a snapshot."""

from __future__ import annotations

import ast
import dataclasses
from importlib import resources
from pathlib import Path

import bitroute_kernel
import numpy as np
import pyarrow as pa
import pytest
from bitroute_kernel import ColumnOverflowError, Kernel, KernelError, TableError

from compiler import Matcher, RoutingIndex, SnapshotFormatError, Subscription
from compiler.columns import StringColumn, string_buffers
from compiler.grammar import KernelGrammar
from compiler.output import Delivery
from compiler.tables import KernelTables


def _tables(**changes) -> KernelTables:
    """Two subscriptions of one subscriber on filters ``a.*`` and ``$share/g/x`` (MQTT-style prefix given)."""
    names: list[str | None] = ["alice"]
    tables = KernelTables(
        delivery_type=Delivery,
        names=names,
        name_text=string_buffers(pa.array(names)),
        ids=string_buffers(pa.array(["s1", "s2"])),
        rank=np.array([0, 1]),
        owners=np.array([0, 0]),
        filter_start=np.array([0, 1]),
        filter_count=np.array([1, 1]),
        filter_slots=np.array([0, 1]),
        special=np.zeros(2, dtype=np.uint8),
        grammars=[KernelGrammar("mqtt", "$share/")],
        filter_text=string_buffers(pa.array(["a/+", "$share/g/x"])),
        filter_exchange=np.array([0, 0]),
        hit_code=np.array([0, 1]),
    )
    return dataclasses.replace(tables, **changes)


def test_the_kernel_reads_its_tables_by_name():
    kernel = Kernel(_tables())
    assert kernel.deliveries(0, "a/b") == (Delivery("alice", ("s1",)),)
    # The shared filter matches as its part after the handed-in prefix and group.
    assert kernel.deliveries(0, "x") == (Delivery("alice", ("s2",)),)
    assert kernel.deliveries(0, "$share/g/x") == ()
    without_prefix = Kernel(_tables(grammars=[KernelGrammar("mqtt", None)]))
    assert without_prefix.deliveries(0, "x") == () and without_prefix.deliveries(0, "$share/g/x") != ()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"hit_code": np.array([0, 7])}, "hit code 7 names no slot"),
        ({"rank": np.array([0])}, "rank and owners need one entry per subscription slot"),
        ({"filter_exchange": np.array([0, 3])}, "no exchange number 3"),
        ({"grammars": [KernelGrammar("stomp", None)]}, "unknown dialect"),
        ({"ids": StringColumn(np.array([0, 2, 1]), np.frombuffer(b"s1s2", dtype=np.uint8))}, "non-decreasing"),
        ({"delivery_type": list}, "tuple subclass"),
        ({"owners": np.array([0.0, 0.0])}, "int64"),
    ],
)
def test_inconsistent_tables_raise_a_table_error(changes, message):
    with pytest.raises(TableError, match=message):
        Kernel(_tables(**changes))


def test_a_missing_table_is_named():
    tables = _tables()
    incomplete = {f.name: getattr(tables, f.name) for f in dataclasses.fields(tables) if f.name != "special"}
    with pytest.raises(AttributeError, match="special"):
        Kernel(type("Incomplete", (), incomplete)())


def test_the_errors_are_one_hierarchy():
    assert issubclass(TableError, KernelError) and issubclass(ColumnOverflowError, KernelError)
    assert issubclass(KernelError, Exception) and not issubclass(KernelError, ValueError)
    with pytest.raises(TableError, match="no exchange number 5"):
        Kernel(_tables()).match_topics(5, ["a"])


def test_the_matcher_reports_tables_the_kernel_refuses_as_a_snapshot_error(monkeypatch):
    index = RoutingIndex({"amq": "amqp"})
    index.upsert(Subscription("s1", "amq", "alice", "a.*"))
    snapshot = index.snapshot(3, {})

    def refuse(tables):
        raise TableError("hit code 9 names no slot")

    monkeypatch.setattr("compiler.matcher.Kernel", refuse)
    with pytest.raises(SnapshotFormatError, match="snapshot 3: the matching kernel refuses its tables: hit code 9"):
        Matcher(snapshot)


def test_the_stub_ships_with_the_module_and_names_every_public_name():
    package = resources.files("bitroute_kernel")
    assert (package / "py.typed").is_file()
    stub = ast.parse((package / "__init__.pyi").read_text())
    declared = {node.name for node in stub.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
    public = {name for name in dir(bitroute_kernel) if not name.startswith("_") and name != "bitroute_kernel"}
    assert public <= declared, public - declared
    kernel = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Kernel")
    kernel_methods = {node.name for node in kernel.body if isinstance(node, ast.FunctionDef)}
    assert {name for name in dir(Kernel) if not name.startswith("_")} <= kernel_methods


def _runtime_parameters(function) -> list[str]:
    """The parameter names pyo3 gives a function, method or class (``__text_signature__``)."""
    text = function.__text_signature__
    names = [p.strip().lstrip("*") for p in text.strip("()").split(",") if p.strip()]
    return [n for n in names if n not in ("$self", "$type", "/")]


def test_the_stub_declares_each_parameter_of_the_module_by_name():
    """kernel/bitroute_kernel.pyi against the built module: every function's and method's
    parameters, in order, as kernel/src declares them (mypy checks the callers against it)."""
    stub = ast.parse((Path(__file__).parents[2] / "kernel" / "bitroute_kernel.pyi").read_text())
    checked = 0
    for node in stub.body:
        if isinstance(node, ast.FunctionDef):
            declared = [a.arg for a in node.args.args]
            assert declared == _runtime_parameters(getattr(bitroute_kernel, node.name)), node.name
            checked += 1
        elif isinstance(node, ast.ClassDef):
            runtime = getattr(bitroute_kernel, node.name, None)  # None: a protocol of the stub's
            if runtime is None or issubclass(runtime, BaseException) or not runtime.__text_signature__:
                continue
            for method in node.body:
                if not isinstance(method, ast.FunctionDef) or any(
                        isinstance(d, ast.Name) and d.id == "property" for d in method.decorator_list):
                    continue
                declared = [a.arg for a in method.args.args[1:]]
                if method.name == "__init__":
                    assert declared == _runtime_parameters(runtime), node.name
                elif not method.name.startswith("__"):
                    assert declared == _runtime_parameters(getattr(runtime, method.name)), \
                        f"{node.name}.{method.name}"
                checked += 1
    assert checked >= 15  # the functions, constructors and methods of the kernel's classes
