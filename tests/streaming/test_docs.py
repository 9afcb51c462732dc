"""What README.md, docs/ and conf/bitroute.toml state that the code can check.

Each topic has one home page and the others link to it by page and section
(`docs/running.md, "The checkpoint folder"`): every such link must name a
section (a heading, or a paragraph's bold lead) of that page. The defaults a
home page states are compared with the configuration's.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from streaming.config import load

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
SOURCES = [ROOT / "README.md", ROOT / "conf" / "bitroute.toml",
           *(page for page in PAGES if page.name != "benchmarks-history.md")]
"""The pages whose links are checked: not the history page, which quotes each run as it was."""
# `docs/running.md, "Settings"`, `running.md "Settings"`, `(docs/design.md, "Guarantees")`;
# in conf/bitroute.toml the reference may run over a comment's line break.
_LINK = re.compile(r'(?:docs/)?([a-z-]+\.md)[,:]? *\(?"([^"]+)"')


def _flat(path: Path) -> str:
    """The text with line breaks (and a TOML comment's `#`) folded into spaces."""
    return re.sub(r"\s*\n\s*(?:# ?)?", " ", path.read_text())


def _sections(page: Path) -> list[str]:
    text = page.read_text()
    headings = [re.sub(r"^#+\s*", "", line).strip() for line in text.splitlines()
                if re.match(r"#+ ", line)]
    bold = re.findall(r"\*\*(.+?)\*\*", text, re.S)
    return headings + [" ".join(b.split()) for b in bold]


def _links() -> list[tuple[str, str, str]]:
    pages = {page.name for page in PAGES}
    return [(str(source.relative_to(ROOT)), page, section)
            for source in SOURCES
            for page, section in _LINK.findall(_flat(source)) if page in pages]


def test_links_are_found_in_the_pages():
    assert len(_links()) > 50  # the pattern still finds the links


@pytest.mark.parametrize("source, page, section", _links())
def test_a_link_to_a_section_names_one_of_that_page(source, page, section):
    sections = _sections(ROOT / "docs" / page)
    assert any(s.startswith(section) or section in s for s in sections), (
        f"{source} links to docs/{page}, {section!r}, which has no such section")


def _section(page: str, heading: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    body = text.split(f"\n{heading}\n", 1)[1]
    return " ".join(re.split(r"\n#+ ", body, maxsplit=1)[0].split())


def test_where_a_batch_is_routed_states_the_defaults():
    """docs/running.md's home of the driver-or-executors choice, against StreamingConfig."""
    text = _section("running.md", "## Where a batch is routed, and what the driver costs")
    streaming = load(environ={}).streaming
    assert streaming.driver_route_max_publishes is None  # "auto"
    assert streaming.driver_route_bounds("local[2]") == (20_000, 100_000)
    assert streaming.driver_route_bounds("spark://master:7077") == (0, 0)
    assert ("Both are `\"auto\"` by default: 20,000 publishes and 100,000 deliveries on a "
            "`local[...]` master, 0 (every batch on the executors) on any other master") in text
    assert streaming.task_audit_files("local[2]") is False
    assert streaming.task_audit_files("spark://master:7077") is True
    assert ("On a `local[...]` master (`streaming.executor_audit_files = \"auto\"`) the tasks "
            "return their routed rows instead") in text
    assert "`\"tasks\"` or `\"driver\"` chooses on any master" in text


def test_the_lease_section_states_the_default_timeout():
    text = _section("running.md", "### One router per publishes topic and warehouse")
    assert load(environ={}).streaming.lease_timeout_s == 60.0
    assert "renewed every quarter of `streaming.lease_timeout` (60 s)" in text
    assert "its lease is taken over once it is 60s old" in text


def test_the_audit_bound_is_the_configured_one():
    """docs/design.md's "Audit exactly once" bound and audit.md's summary of it."""
    audit = load(environ={}).audit
    assert audit.commit_interval_s == 2.0
    with pytest.raises(Exception, match="at most 10 seconds"):
        load(overrides={"audit.commit_interval": "11 seconds"}, environ={})
    design = " ".join((ROOT / "docs" / "design.md").read_text().split())
    assert "`audit.commit_interval` (2 s by default, at most 10 s)" in design
    assert "`audit.commit_interval` (2 s)" in " ".join((ROOT / "docs" / "audit.md")
                                                      .read_text().split())


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header row starts with ``header``, as cells."""
    lines = text.split(f"\n{header}", 1)[1].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def test_the_spark_settings_table_is_what_the_session_sets(monkeypatch):
    """docs/running.md, "Spark settings bitroute applies", against session_settings."""
    from streaming.session import session_settings

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    text = (ROOT / "docs" / "running.md").read_text()
    section = text.split("\n### Spark settings bitroute applies\n", 1)[1].split("\n### ", 1)[0]
    config = load(environ={})
    settings = session_settings(config)
    literal = {"`true`": "true", "`false`": "false", "`UTC`": "UTC", "`20`": "20",
               "`FAIR`": "FAIR", "`spark.shuffle_partitions`": str(config.spark.shuffle_partitions),
               "`spark.app_name` (`bitroute`)": "bitroute"}
    for keys, value, _why in _table_rows(section, "| Spark key |"):
        for key in re.findall(r"`([^`]+)`", keys):
            assert key in settings, key
            if value in literal:
                assert settings[key] == literal[value], key
    assert config.spark.app_name == "bitroute"
    # Every key the session sets, on a local or a cluster master, is named in the section.
    cluster = session_settings(load(overrides={"spark.master": "spark://m:7077"}, environ={}))
    for key in {**settings, **cluster}:
        assert f"`{key}" in section, f"running.md does not say bitroute sets {key}"


SETTINGS_ON_A_CLUSTER = {
    "kafka.bootstrap": ("kafka-1:9092,kafka-2:9092", "kafka-1:9092,kafka-2:9092"),
    "broker.embedded": ("false", False),
    "kafka.replication_factor": ("3", 3),
    "kafka.partitions": ("6", 6),
    "delta.warehouse": ("/mnt/shared/bitroute/delta", "/mnt/shared/bitroute/delta"),
    "streaming.checkpoint_dir": ("/var/lib/bitroute/checkpoints",
                                 Path("/var/lib/bitroute/checkpoints")),
    "spark.master": ("spark://spark-master:7077", "spark://spark-master:7077"),
}


def test_the_settings_to_change_on_a_cluster_load_from_their_variables():
    """docs/running.md, "Settings": each row's key is set by its environment variable."""
    text = (ROOT / "docs" / "running.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n### ", 1)[0]
    rows = _table_rows(section, "| setting |")
    assert sorted(key.strip("`") for key, _, _ in rows) == sorted(SETTINGS_ON_A_CLUSTER)
    for key, variable, _ in rows:
        key, variable = key.strip("`"), variable.strip("`")
        raw, expected = SETTINGS_ON_A_CLUSTER[key]
        section_name, name = key.split(".")
        value = getattr(getattr(load(environ={variable: raw}), section_name), name)
        assert (str(value) if isinstance(expected, str) else value) == expected, key


def test_a_table_setting_is_refused_in_the_environment_naming_the_key():
    """docs/running.md, "Settings": tables only in the file or with --set."""
    from streaming.config import ConfigError

    with pytest.raises(ConfigError, match="exchanges.dialects|EXCHANGES_DIALECTS"):
        load(environ={"BITROUTE_EXCHANGES_DIALECTS": "amq.topic=amqp"})


def test_the_run_json_sample_has_the_batch_report_fields():
    """docs/running.md, "Stopping and restarting": `bitroute run --json`'s object."""
    import dataclasses
    import json

    from streaming.cli.progress import DEPRECATED_KEYS
    from streaming.router.batch.report import BatchReport

    text = (ROOT / "docs" / "running.md").read_text()
    section = text.split("\n### Stopping and restarting\n", 1)[1]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None, "the sample batch line"
    sample = json.loads(block.group(1))
    fields = [f.name for f in dataclasses.fields(BatchReport)] + ["finished_at", *DEPRECATED_KEYS]
    assert sorted(sample) == sorted(fields)


_TYPE_NAMES = {"StringType": "string", "LongType": "long", "IntegerType": "int",
               "TimestampType": "timestamp", "BooleanType": "boolean", "DateType": "date",
               "ArrayType": "array<string>", "MapType": "map<string,string>"}


@pytest.mark.parametrize("table", ["deliveries", "messages", "subscriptions"])
def test_the_audit_page_lists_each_table_s_columns_as_the_schema_has_them(table):
    """docs/audit.md's column tables against schemas/tables.py: names in order, types,
    nullability."""
    from schemas.tables import AUDIT_TABLES

    text = (ROOT / "docs" / "audit.md").read_text().replace("&lt;", "<").replace("&gt;", ">")
    section = re.split(rf"\n## `{table}`[^\n]*\n", text, maxsplit=1)[1].split("\n## ", 1)[0]
    documented = [(name.strip("`"), kind) for name, kind, _ in
                  _table_rows(section, "| column | type | meaning |")]
    schema = AUDIT_TABLES[table]
    assert [name for name, _ in documented] == schema.fieldNames()
    for (name, kind), field in zip(documented, schema.fields, strict=True):
        assert kind.split(", nullable")[0] == _TYPE_NAMES[type(field.dataType).__name__], name
        assert ("nullable" in kind) == field.nullable, name


def _pin(requirement: str) -> tuple[str, str]:
    """(name, version) of a pinned requirement, ``name==version``."""
    found = re.match(r"([A-Za-z0-9_.-]+)==(\S+)$", requirement)
    assert found is not None, requirement
    return found.group(1), found.group(2)


def _pins() -> tuple[dict[str, str], dict[str, list[str]]]:
    """pyproject.toml's pinned Python distributions and conf/jvm.toml's artifacts per group."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    python = dict(_pin(d) for d in project["dependencies"] if "==" in d)
    jvm = {group: table["artifacts"]
           for group, table in tomllib.loads((ROOT / "conf" / "jvm.toml").read_text()).items()}
    return python, jvm


def test_the_versions_the_pages_name_are_the_pinned_ones():
    """docs/running.md's requirements and docs/audit.md's version table, against
    pyproject.toml and conf/jvm.toml."""
    python, jvm = _pins()
    running = " ".join((ROOT / "docs" / "running.md").read_text().split())
    audit = " ".join((ROOT / "docs" / "audit.md").read_text().split())
    pyspark, delta = python["pyspark"], python["delta-spark"]
    [connector] = jvm["spark"]
    [delta_jar] = [a for a in jvm["delta"] if ":delta-spark_" in a]
    [hadoop_aws] = jvm["s3a"]
    spark_minor = ".".join(pyspark.split(".")[:2])
    assert connector.endswith(f":{pyspark}") and delta_jar.endswith(f":{delta}")
    assert f"pyspark {pyspark} is pinned in `pyproject.toml`, the Kafka connector {pyspark}" in running
    assert f"| Spark | {spark_minor}.x built for Scala 2.13" in running
    assert f"delta-spark {delta}" in running
    assert f"`{connector}`" in running
    assert f"| {pyspark} (bitroute's pin) | `{delta_jar}` | `delta-spark=={delta}` |" in audit
    assert f"hadoop-aws {hadoop_aws.rsplit(':', 1)[1]}" in audit


def test_where_state_lives_names_every_path_of_the_checkpoint_folder():
    """docs/operations.md, "Where state lives", against CheckpointLayout: every path the
    table gives under the checkpoint folder is the layout's, and every path the layout
    defines (its properties) is in the table, under a folder it names, or a folder of
    paths it names."""
    from streaming.state.checkpoint import CheckpointLayout

    layout = CheckpointLayout.of("/c")
    defined = {str(value.relative_to("/c")) for name in dir(CheckpointLayout)
               if not name.startswith("_")
               and isinstance(value := getattr(layout, name), Path) and value != layout.root}
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Where state lives\n", 1)[1].split("\n## ", 1)[0]
    documented = {re.split(r"/?<", path, maxsplit=1)[0].rstrip("/") for path in
                  re.findall(r"`<(?:streaming\.)?checkpoint_dir>/([^`]+)`", section)}
    for path in documented:
        assert any(path == d or path.startswith(d + "/") for d in defined), path
    for path in defined:
        assert any(path == d or path.startswith(d + "/") or d.startswith(path + "/")
                   for d in documented), (
            f"docs/operations.md, Where state lives: no row for <checkpoint_dir>/{path}")


def test_the_audit_page_s_summary_of_the_verb_has_the_parser_s_flags():
    """docs/audit.md's `bitroute audit` block against docs/cli.md (generated from the parser)."""
    audit = (ROOT / "docs" / "audit.md").read_text()
    block = audit.split("\n## `bitroute audit`\n", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    cli = (ROOT / "docs" / "cli.md").read_text()
    reference = cli.split("\n## bitroute audit\n", 1)[1].split("\n## ", 1)[0]
    parser_flags = set(re.findall(r"^\| `(--[a-z-]+)`", reference, re.M)) | {"--config", "--set"}
    assert set(re.findall(r"(--[a-z-]+)", block)) == parser_flags
    assert set(re.findall(r"^bitroute audit ([a-z|]+)", block, re.M)) == {
        "maintain", "migrate", "deliveries|messages|subscriptions"}


def test_the_image_s_defaults_are_the_dockerfile_s():
    """docs/running.md, "Docker": the user, folder and settings the image runs with."""
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    docker = " ".join((ROOT / "docs" / "running.md").read_text()
                      .split("\n## Docker\n", 1)[1].split("\n### ", 1)[0].split())
    assert "It runs as user `bitroute` (uid 1000) in `/data`" in docker
    assert "useradd --create-home --uid 1000 bitroute" in dockerfile
    assert "\nWORKDIR /data\n" in dockerfile
    for variable, value, said in (
            ("BITROUTE_BROKER_EMBEDDED", "false", "`BITROUTE_BROKER_EMBEDDED=false`"),
            ("BITROUTE_DELTA_WAREHOUSE", "/data/delta", "the warehouse at `/data/delta`"),
            ("BITROUTE_STREAMING_CHECKPOINT_DIR", "/data/checkpoints",
             "the checkpoints at `/data/checkpoints`"),
            ("BITROUTE_BROKER_DATA_DIR", "/data/broker", "the broker's data at `/data/broker`"),
            ("PYSPARK_PYTHON", "/opt/bitroute/bin/python", "`PYSPARK_PYTHON`")):
        assert re.search(rf"\b{variable}={re.escape(value)}\b", dockerfile), variable
        assert said in docker, said
    assert "RUN bitroute jars --s3a" in dockerfile and "`bitroute jars --s3a`" in docker


def _pages_and_config() -> list[Path]:
    """README.md, conf/bitroute.toml, every page but the generated CLI reference and the
    history, and the deploy/ and docker/ files, which state commands too."""
    files = [page for page in SOURCES if page.name != "cli.md"]
    files += [p for folder in ("deploy", "docker") for p in sorted((ROOT / folder).rglob("*"))
              if p.is_file() and p.suffix in ("", ".md", ".yaml", ".yml", ".sh", ".toml")]
    return files


def _stated_verb_flags() -> list[tuple[str, str, str]]:
    """(file, verb, flag) for every `--flag` written after `bitroute VERB` on one command line."""
    found = []
    for path in _pages_and_config():
        text = path.read_text()
        for command in re.finditer(r"bitroute ([a-z]+)((?:[ \t]+(?:\\\n\s*)?[^\s`|]+)*)", text):
            for flag in re.findall(r"(?<![\w-])(--[a-z0-9-]+)", command.group(2)):
                found.append((str(path.relative_to(ROOT)), command.group(1), flag))
    return sorted(set(found))


def test_the_commands_the_pages_state_are_found():
    assert len(_stated_verb_flags()) > 40  # the pattern still finds them


@pytest.mark.parametrize("source, verb, flag", _stated_verb_flags())
def test_a_flag_a_page_gives_a_verb_is_one_of_the_verb_s(source, verb, flag):
    """Every `bitroute VERB ... --flag` in the pages is the parser's (a word that is not a
    verb, as in "bitroute routes", is prose)."""
    from streaming.cli.parser import build_parser
    from streaming.cli.reference import _verbs

    verbs = _verbs(build_parser())
    if verb not in verbs:
        return
    options = {name for action in verbs[verb]._actions for name in action.option_strings}
    assert flag in options, f"{source}: `bitroute {verb} {flag}`: {verb} has no such flag"


def test_every_bitroute_verb_a_page_names_exists():
    from streaming.cli.parser import build_parser
    from streaming.cli.reference import _verbs

    verbs = set(_verbs(build_parser()))
    named = {(str(path.relative_to(ROOT)), verb) for path in _pages_and_config()
             for verb in re.findall(r"`bitroute ([a-z-]+)", path.read_text())}
    assert len(named) > 20
    assert not {(source, verb) for source, verb in named if verb not in verbs}


def test_the_make_targets_the_pages_name_are_the_makefile_s():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = {(str(path.relative_to(ROOT)), target) for path in _pages_and_config()
             for target in re.findall(r"(?:^|`)[ \t]*make ([a-z][a-z-]*)\b", path.read_text(),
                                      re.M)}
    assert {"run", "test", "test-unit", "jars"} <= {target for _, target in named}
    assert not {(source, target) for source, target in named if target not in targets}


@functools.cache
def _code_strings() -> list[str]:
    """The literal parts of every string in streaming/ (an f-string's between its
    placeholders, a format string's between its `{}`/`%s`) and realtime/'s Java strings:
    what a log line the code prints is made of."""
    import ast

    parts: set[str] = set()
    for path in sorted((ROOT / "streaming").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.JoinedStr):
                parts |= {value.value for value in node.values
                          if isinstance(value, ast.Constant) and isinstance(value.value, str)}
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts |= set(re.split(r"\{[^}]*\}|%[sdr]|%\.\d+f", node.value))
    for path in sorted((ROOT / "realtime").rglob("*.java")):
        parts |= set(re.findall(r'"((?:[^"\\]|\\.)*)"', path.read_text()))
    # A page may quote a line cut short ("...; set [kafka.client] security.protocol ..."):
    # each clause of a literal counts on its own too.
    parts |= {clause for part in parts for clause in re.split(r"[;:()]", part)}
    return sorted({p.strip() for p in parts if len(p.strip()) >= 6}, key=len, reverse=True)


def _words_not_in_the_code(line: str, parts: list[str]) -> list[str]:
    """The runs of ``line`` no code string covers that hold three plain words or more (a
    run of values, such as a topic, a principal, an offset range or a time, holds fewer)."""
    covered = [False] * len(line)
    for part in parts:
        start = 0
        while (at := line.find(part, start)) >= 0:
            covered[at:at + len(part)] = [True] * len(part)
            start = at + 1
    runs = re.split(r"\x00+", "".join("\x00" if c else ch
                                           for ch, c in zip(line, covered, strict=True)))
    return [run for run in runs
            if len([word for word in run.split() if re.fullmatch(r"[a-z]{3,}[,;]?", word)]) >= 3]


def _quoted_log_lines() -> list[tuple[str, str]]:
    """The lines the pages quote as bitroute prints them: an indented block of one line, and
    a `bitroute: ...` line of a fenced block."""
    found = []
    for page in ("operations.md", "running.md", "security.md", "design.md", "audit.md",
                 "reliability.md"):
        text = (ROOT / "docs" / page).read_text()
        found += [(page, line) for line in re.findall(r"\n\n {4,}(\S.*)(?=\n\n)", text)
                  if not line.startswith("bitroute sql")]
        fenced = False
        for line in text.splitlines():
            if line.strip().startswith("```"):
                fenced = not fenced
            elif fenced and line.strip().startswith("bitroute: "):
                found.append((page, line.strip()))
    return sorted(set(found))


def test_the_quoted_log_lines_are_found():
    assert len(_quoted_log_lines()) >= 18


@pytest.mark.parametrize("page, line", _quoted_log_lines())
def test_a_log_line_a_runbook_quotes_is_made_of_the_code_s_strings(page, line):
    """Each line docs/operations.md (and the pages beside it) quote as the router's own is
    the code's text around its values, so a reworded message fails here until the page
    quotes it anew."""
    assert not _words_not_in_the_code(line, _code_strings()), (
        f"docs/{page} quotes a line the code does not print: {line}")


def test_a_reworded_log_line_is_caught():
    parts = _code_strings()
    assert _words_not_in_the_code(
        "bitroute: batch 7: 20 publishes were deleted by Kafka (retention or DeleteRecords) "
        "before the router read them", parts) == []
    assert _words_not_in_the_code(
        "bitroute: batch 7: 20 publishes vanished from the broker before anyone read them",
        parts)


def test_the_readme_s_match_example_prints_what_it_says(tmp_path: Path):
    """README.md's `bitroute match` block, run as written: its files, its command, and
    the output its comments show."""
    from cli_runner import run_cli

    readme = (ROOT / "README.md").read_text()
    block = readme.split("`bitroute match` checks routing offline", 1)[1]
    block = block.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    for line in lines:
        if line.startswith("printf "):
            printf = re.fullmatch(r"printf '%s\\n' (.*) > (\S+)", line)
            assert printf is not None, line
            records, target = printf.groups()
            (tmp_path / target).write_text(
                "".join(record + "\n" for record in re.findall(r"'([^']*)'", records)))
    [command] = [line for line in lines if line.startswith("bitroute match ")]
    result = run_cli(*command.split()[1:], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    expected = [line[2:] for line in lines if line.startswith("# {")]
    assert result.stdout.splitlines() == expected


def test_the_kafka_client_keys_the_pages_list_are_the_supported_ones():
    """docs/security.md's key table and conf/bitroute.toml's `[kafka.client]` comment
    against streaming/kafka/settings.py's SUPPORTED: keys and allowed values."""
    from streaming.kafka.settings import SUPPORTED

    security = (ROOT / "docs" / "security.md").read_text()
    rows = _table_rows(security, "| key | values |")
    documented = {key for row in rows for cell in row
                  for key in re.findall(r"`((?:security|sasl|ssl|client)\.[a-z.]+)`", cell)}
    assert documented == set(SUPPORTED)
    for keys, values in rows:
        for key in re.findall(r"`([a-z.]+)`", keys):
            choices = SUPPORTED.get(key)
            if choices:
                assert all(f"`{value}`" in values for value in choices), key
    toml = _flat(ROOT / "conf" / "bitroute.toml")
    comment = toml.split("[kafka.client]", 1)[1].split("any other key is refused", 1)[0]
    named = set(re.findall(r"\b((?:security|sasl|ssl|client)\.[a-z.]*[a-z])\b", comment))
    assert named - {"security.md"} == set(SUPPORTED)
    for key in ("security.protocol", "sasl.mechanism"):
        choices = SUPPORTED[key]
        assert choices is not None and f"{key} ({', '.join(choices)})" in comment, key


_REPO_PATH = re.compile(r"(?<![\w/$.<>-])((?:tests|streaming|compiler|schemas|benchmarks|kernel|realtime"
                        r"|deploy|docker|conf)/[A-Za-z0-9_/.\-]*[A-Za-z0-9_])(?:(?:::|:: )(test_\w+))?")
_NOT_A_PATH = {"deploy/bitroute-router",  # kubectl's deploy/<name>
               "realtime/audit"}  # the checkpoint folder's, docs/operations.md


def _named_paths() -> list[tuple[str, str, str | None]]:
    """(page, path, test function or None) for every repository path a page names."""
    return sorted({(str(page.relative_to(ROOT)), path, test)
                   for page in SOURCES
                   for path, test in _REPO_PATH.findall(" ".join(page.read_text().split()))
                   if path not in _NOT_A_PATH})


def test_the_pages_name_repository_paths():
    assert len(_named_paths()) > 100


@pytest.mark.parametrize("page, path, test", _named_paths())
def test_a_path_a_page_names_exists(page, path, test):
    """A file, folder or glob (`kernel/src/*.rs`) of the repository a page names exists, and
    a test it names as `file::test_name` is defined in that file."""
    assert (ROOT / path).exists() or list(ROOT.glob(path)) or list(ROOT.glob(path + "*")), (
        f"{page} names {path}, which does not exist")
    if test:
        assert f"def {test}(" in (ROOT / path).read_text(), f"{page}: {path}::{test}"


def test_a_test_a_page_names_by_its_function_is_defined():
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    for page in SOURCES:
        text = page.read_text()
        for name in set(re.findall(r"`(test_[a-z0-9_]+)`", text)
                        + re.findall(r"::\s?(test_[a-z0-9_]+)", text)):
            assert f"def {name}(" in sources, f"{page.name} names {name}, which no test defines"


def test_the_audit_page_s_windows_are_the_reader_s():
    """docs/audit.md's "Answers stream" figures against streaming/audit/queries.py."""
    from streaming.audit import queries
    from streaming.audit.files import ROW_GROUP_ROWS

    audit = " ".join((ROOT / "docs" / "audit.md").read_text().split())
    assert (f"until a window holds {queries.FIRST_WINDOW_ROWS:,} rows of the table (every "
            f"subscriber's) or {queries.FIRST_WINDOW_FILES} files") in audit
    assert {2: "twice", 4: "four times"}[queries.WINDOW_GROWTH] + " the previous one's" in audit
    assert (f"up to {queries.MAX_WINDOW_ROWS:,} rows or {queries.MAX_WINDOW_FILES:,} files"
            in audit)
    assert f"row groups ({ROW_GROUP_ROWS:,} rows each)" in audit


def test_the_cli_reference_names_the_exit_statuses_the_verbs_return():
    """Every `return N` of a verb's handler (`broker status` and `status`: 3 when down) is
    an exit status docs/cli.md gives that verb."""
    cli = (ROOT / "docs" / "cli.md").read_text()
    for verb in ("broker", "status"):
        section = cli.split(f"\n## bitroute {verb}\n", 1)[1].split("\n## ", 1)[0]
        assert "\n- 3: " in section, verb


_VALUE = r"(`[^`]+`|\d[\d,]*(?:\.\d+)?(?: (?:ms|s|hours?|minutes?|seconds?))?)"
_STATED_DEFAULT = re.compile(
    r"`((?:kafka|broker|exchanges|delta|streaming|audit|spark|metrics|limits)\.[a-z_]+)`"
    r"[^(`.]{0,25}\((?:default )?" + _VALUE + r"(?: \w+)?(?: by default)?[,;)]")


def _stated_defaults() -> list[tuple[str, str, str]]:
    """(page, key, value) for each "`section.key` (VALUE)", "(VALUE by default" or
    "(default VALUE)" a page writes."""
    return sorted({(page.name, key, value) for page in SOURCES if page.suffix == ".md"
                   for key, value in _STATED_DEFAULT.findall(" ".join(page.read_text().split()))
                   if not value.startswith(("`BITROUTE_", "`--"))})  # how to set it, not a value


def test_the_pages_state_defaults():
    assert len(_stated_defaults()) >= 15


@pytest.mark.parametrize("page, key, value", _stated_defaults())
def test_a_default_a_page_states_is_the_configuration_s(page, key, value):
    from streaming.config import duration_seconds

    section, name = key.split(".")
    config = load(environ={})
    default = getattr(getattr(config, section), name)
    if key == "streaming.driver_route_max_publishes":  # "auto": the pages state a local master's
        default = config.streaming.driver_route_bounds("local[2]")[0]
    if value.startswith("`"):  # as conf/bitroute.toml writes it (a path not yet resolved)
        written = getattr(type(getattr(config, section))(), name)
        assert value.strip("`") == str(written), (page, key)
        return
    number, _, unit = value.replace(",", "").partition(" ")
    seconds = {"": None, "ms": 0.001, "s": 1.0, "second": 1.0, "seconds": 1.0, "minute": 60.0,
               "minutes": 60.0, "hour": 3600.0, "hours": 3600.0}[unit]
    if seconds is None:
        assert float(number) == float(default), (page, key)
    elif isinstance(default, str):
        assert float(number) * seconds == duration_seconds(default), (page, key)
    else:  # an integer of milliseconds
        assert float(number) * seconds == default / 1000, (page, key)


def test_no_page_but_the_history_cites_an_issue_number():
    """The pages describe the code as it is; which issue asked for what is the history's
    (another project's issue, `delta-io/delta-rs#2882`, is a reference, not ours)."""
    for page in _pages_and_config() + [ROOT / "docs" / "cli.md"]:
        cited = re.findall(r"\b[Ii]ssues? #?\d+|(?<![\w/-])#\d+\b(?!-)", page.read_text())
        assert not cited, f"{page.relative_to(ROOT)} cites {cited}"


def test_the_changelog_reader_s_waits_are_the_ones_the_pages_give():
    from streaming.router.subscriptions import changelog

    architecture = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    operations = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    poll_ms, fetch_ms = round(changelog._POLL_TIMEOUT_S * 1000), changelog._FETCH_WAIT_MS
    assert (f"`consume` waits {poll_ms} ms, the changelog consumer's fetch {fetch_ms} ms"
            in architecture)
    assert f"a {poll_ms} ms poll, a {fetch_ms} ms fetch wait" in operations


def test_the_limits_table_is_the_configuration_s():
    """docs/design.md, "Limits": one row per limit of `[limits]`, with its default."""
    from streaming.config import LIMIT_NAMES

    design = (ROOT / "docs" / "design.md").read_text()
    rows = _table_rows(design.split("\n### Limits\n", 1)[1], "| key | what it bounds | default |")
    limits = load(environ={}).limits
    assert [key.strip("`") for key, _, _ in rows] == [f"limits.{name}" for name in LIMIT_NAMES]
    for key, _, default in rows:
        assert int(default.replace(",", "")) == getattr(limits, key.strip("`").split(".")[1]), key


NOT_SETTINGS = {"BITROUTE_KAFKA_PASSWORD",  # an `env:` value's example variable
                "BITROUTE_KAFKA_CLIENT_",  # security.md: the prefix the environment refuses
                "BITROUTE_KERNEL_URL",  # the image's build: where the kernel's wheel is
                "BITROUTE_BENCH_BOOTSTRAP", "BITROUTE_E2E_TIMEOUT"}  # the benchmarks'


def test_every_bitroute_variable_a_page_names_sets_a_key():
    """`BITROUTE_<SECTION>_<KEY>` in the pages, deploy/ and docker/ is a configuration key's
    variable (the others are listed above, each with what it is)."""
    import dataclasses

    from streaming.config import _SECTION_TYPES

    keys = {f"BITROUTE_{section.upper()}_{f.name.upper()}"
            for section, kind in _SECTION_TYPES.items() for f in dataclasses.fields(kind)}
    for path in _pages_and_config() + [ROOT / "docs" / "benchmarks.md"]:
        for variable in set(re.findall(r"BITROUTE_[A-Z0-9_]+", path.read_text())):
            assert variable in keys | NOT_SETTINGS, f"{path.relative_to(ROOT)}: {variable}"


def test_the_maintain_sample_is_what_the_verb_prints():
    """docs/operations.md's `bitroute audit maintain` summary against render's lines."""
    from streaming.audit.maintenance import MaintenanceReport, TableReport
    from streaming.cli.render import maintenance_lines

    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.split("`bitroute audit maintain`\n", 1)[1].split("\n## ", 1)[0]
    [sample] = re.findall(r"```\n(deliveries: .*?)```", section, re.S)
    first, _, last = sample.strip().splitlines()
    table = TableReport("deliveries", files_before=1003, bytes_before=int(4.1 * 1024 ** 2),
                        files_after=1, bytes_after=int(3.6 * 1024 ** 2), partitions_compacted=1,
                        files_compacted=1003, compacted_into=1, checkpoint_version=1006,
                        log_entries_removed=1004, log_entries=4, version=1006, seconds=2.31)
    report = MaintenanceReport("2026-11-24T18:39:57.000+00:00", "2026-11-24T18:40:00.000+00:00",
                               3.10, [table])
    assert maintenance_lines(report) == [first, last]


def test_the_explain_sample_is_what_the_verb_prints():
    """docs/operations.md's `bitroute explain` sample: its first line's wording and its table
    as render.table prints the rows it shows."""
    from streaming.cli.render import state_source, table
    from streaming.ops.inspect import RoutingState

    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.split("`bitroute explain`\n", 1)[1].split("\n## ", 1)[0]
    [sample] = re.findall(r"```\n(amq\.topic .*?)```", section, re.S)
    first, *lines = sample.strip().splitlines()
    source = state_source(RoutingState(snapshot=None, base_version=12, changes_applied=0,
                                       stale=None))
    assert first == f"amq.topic orders.eu.paid: 1 subscriber: billing ({source})"
    columns = ["subscriber", "subscription_id", "filter", "header_match", "header_criteria",
               "shared_group"]
    rows: list[dict[str, object]] = [
            dict(zip(columns, ("billing", "s1", "orders.*.paid", None, None, None), strict=True)),
            dict(zip(columns, ("billing", "s2", "orders.#", "all", {"region": "eu"}, None),
                     strict=True))]
    assert list(table(columns, rows)) == lines


def test_the_metrics_table_gives_each_metric_its_kind_and_labels():
    """docs/operations.md, "Metrics": a row's type and `{labels}` are the declaration's
    (tests/streaming/ops/test_metrics.py holds the names)."""
    from streaming.ops.metrics import METRICS

    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    declared = {metric.name: metric for metric in METRICS}
    rows = _table_rows(section, "| metric | type | meaning |")
    assert len(rows) == len(declared)
    for name, kind, _ in rows:
        name, _, labels = name.strip("`").partition("{")
        metric = declared[name]
        assert kind == metric.kind, name
        # `bitroute_mode` and `bitroute_latency_seconds` name their label in the meaning.
        if labels or metric.name not in ("bitroute_mode", "bitroute_latency_seconds"):
            assert tuple(filter(None, labels.rstrip("}").split(","))) == metric.labels, name


def test_the_record_contracts_name_the_schemas_fields_and_outcomes():
    """docs/design.md, "Record contracts": the changelog value's members, the outcomes of
    `messages` and the changes of `subscriptions` are schemas/records.py's."""
    from schemas import records

    design = " ".join((ROOT / "docs" / "design.md").read_text().split())
    contracts = design.split("## Record contracts", 1)[1].split("## Guarantees", 1)[0]
    value = re.search(r"Value: JSON `\{(.*?)\}`, the", contracts)
    assert value is not None
    members = [m for m in re.findall(r'"([a-z_]+)"', value.group(1))
               if m not in ("all", "any", *records.HEADER_CRITERIA_FIELDS)]  # headers' values
    assert members == list(records.SUBSCRIPTION_FIELDS)
    audit = contracts.split("**Audit tables**", 1)[1]
    named = [getattr(records, name) for name in dir(records)
             if name.startswith(("OUTCOME_", "CHANGE_"))]
    assert len(named) >= 9
    for value in named:
        assert f"`{value}`" in audit, value
    headers = [getattr(records, name) for name in dir(records) if name.endswith("_HEADER")]
    assert len(headers) >= 13
    for header in headers:
        assert f"`{header}" in contracts, f"design.md's record contracts lack the header {header}"


def test_the_readme_s_layout_has_every_folder_and_package():
    """README.md's layout table: a row per top-level folder of the repository, and the
    `streaming/` row names each of its packages."""
    readme = (ROOT / "README.md").read_text()
    rows = {name.strip("`"): what for name, what in _table_rows(readme, "| folder | what |")}
    folders = {p.name + "/" for p in ROOT.iterdir() if p.is_dir()
               and not p.name.startswith((".", "__")) and not p.name.endswith(".egg-info")
               and p.name not in ("build", "dist", "spark-warehouse")}  # made by tools
    assert folders <= set(rows), folders - set(rows)
    packages = {p.name for p in (ROOT / "streaming").iterdir() if (p / "__init__.py").exists()}
    assert all(f"`{package}/`" in rows["streaming/"] for package in packages), packages


def test_the_architecture_s_tree_names_every_module():
    """docs/architecture.md, "Where things live": every module of streaming/ is named in the
    tree (a package's errors.py and the verbs' handlers, under `verbs/`, go without saying)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    tree = text.split("Where things live: the folder names are the architecture.\n\n```\n", 1)[1]
    words = set(re.findall(r"[a-z_]+", tree.split("```", 1)[0]))
    modules = [p for p in (ROOT / "streaming").rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py", "errors.py")
               and p.parent.name != "verbs"]
    missing = sorted(str(p.relative_to(ROOT)) for p in modules if p.stem not in words)
    assert not missing, f"docs/architecture.md's tree does not name {missing}"


def _python_snippet_names() -> list[tuple[str, str, str]]:
    """(file, module, name) of every `from MODULE import NAME` / `from PKG import MODULE as X`
    and `MODULE.NAME` of a `python -c` a page or a script gives."""
    found = set()
    for path in _pages_and_config():
        for code in re.findall(r"python -c [\"'](.*)", path.read_text()):
            for module, names in re.findall(r"from ([\w.]+) import ([\w, ]+?)(?:;|$| as )", code):
                for name in names.split(","):
                    found.add((str(path.relative_to(ROOT)), module, name.strip()))
            for alias, attribute in re.findall(r"\b(\w+)\.(\w+)\b", code):
                imported = re.findall(r"from ([\w.]+) import (\w+) as " + alias + r"\b", code)
                imported += [(module, alias) for module in
                             re.findall(r"from ([\w.]+) import " + alias + r"\b(?! as)", code)]
                for module, name in imported:
                    found.add((str(path.relative_to(ROOT)), f"{module}.{name}", attribute))
    return sorted(found)


def test_the_python_snippets_are_found():
    assert len(_python_snippet_names()) >= 4


@pytest.mark.parametrize("source, module, name", _python_snippet_names())
def test_a_python_snippet_names_what_exists(source, module, name):
    """`python -c "from streaming.session import router_jars; ..."` in a page or a script
    names a module and an attribute the code has (a move that leaves the page behind fails)."""
    import importlib

    try:
        importlib.import_module(f"{module}.{name}")  # a module of a package
    except ModuleNotFoundError:
        assert hasattr(importlib.import_module(module), name), f"{source}: {module}.{name}"


def _dotted_names() -> list[tuple[str, str]]:
    """(page, name) of every backticked `streaming.…`, `compiler.…`, `schemas.…` or
    `bitroute_kernel.…` name a page gives that is not a configuration key."""
    import dataclasses

    from streaming.config import _SECTION_TYPES

    keys = {f"{section}.{f.name}" for section, kind in _SECTION_TYPES.items()
            for f in dataclasses.fields(kind)}
    pattern = r"`((?:streaming|compiler|schemas|bitroute_kernel)\.[A-Za-z_][\w.]*[A-Za-z_])(?:\(\))?`"
    return sorted({(page.name, name) for page in SOURCES
                   for name in re.findall(pattern, page.read_text()) if name not in keys})


def test_the_pages_name_code():
    assert len(_dotted_names()) >= 20


@pytest.mark.parametrize("page, name", _dotted_names())
def test_a_dotted_name_a_page_gives_resolves(page, name):
    """`streaming.router.batch.report.BatchReport`, `compiler.grammar.KernelGrammar`: the
    longest importable module, then attributes."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            assert hasattr(target, attribute), f"{page}: {name}"
            target = getattr(target, attribute)
        return
    pytest.fail(f"{page}: {name} names no module")


def test_a_module_path_given_within_its_package_exists():
    """`router/batch/batch_rows.py`, `audit/test_journal.py`: a path the pages give relative
    to streaming/ (a module) or tests/streaming/ (its test) exists there."""
    named = {(page.name, path) for page in SOURCES for path in re.findall(
        r"(?<![\w/.-])((?:router|audit|ops|cli|kafka|realtime|state)/[\w/]+\.py)", page.read_text())}
    assert len(named) >= 10
    missing = sorted((page, path) for page, path in named
                     if not (ROOT / "streaming" / path).exists()
                     and not (ROOT / "tests" / "streaming" / path).exists())
    assert not missing, missing


def test_the_reliability_page_lists_the_campaign_s_cases():
    """docs/reliability.md's commands name every case of `python -m tests.reliability`, and
    realtime mode's."""
    from tests.reliability.cases import CASES, REALTIME_CASES

    page = (ROOT / "docs" / "reliability.md").read_text()
    assert f"python -m tests.reliability {{{','.join([*CASES, 'all'])}}} [options]" in page
    assert (f"python -m tests.reliability {{{','.join([*REALTIME_CASES, 'all'])}}} --mode realtime"
            in page)


def test_every_benchmark_a_page_runs_is_a_scenario():
    """`python -m benchmarks NAME` in the pages (benchmarks.md's commands included) names a
    scenario of the harness, and benchmarks.md has a section for each scenario."""
    from benchmarks.__main__ import SCENARIOS

    named = {(page.name, name) for page in [*SOURCES, ROOT / "docs" / "benchmarks.md"]
             for name in re.findall(r"python -m benchmarks ([a-z][a-z0-9-]*)", page.read_text())}
    assert len(named) >= 10
    assert not {(page, name) for page, name in named if name not in SCENARIOS}
    headings = set(re.findall(r"^## (\S+)$", (ROOT / "docs" / "benchmarks.md").read_text(), re.M))
    assert set(SCENARIOS) <= headings, set(SCENARIOS) - headings


def test_the_readme_s_lint_paths_are_the_makefile_s():
    """README.md's `make lint` paragraph names what the Makefile's LINT_PATHS checks."""
    makefile = (ROOT / "Makefile").read_text()
    found = re.search(r"^LINT_PATHS := (.*)$", makefile, re.M)
    assert found is not None
    readme = " ".join((ROOT / "README.md").read_text().split())
    paragraph = readme.split("`make lint` runs ruff", 1)[1].split(" as `[tool.ruff]`", 1)[0]
    paragraph = paragraph.split(" and mypy over ", 1)[1]
    named = {path.rstrip("/") for path in re.findall(r"`([\w./]+)`", paragraph)}
    assert named == set(found.group(1).split())
