"""Bad input found by probing the commands (session 22): each gets one line on stderr and exit 2 (usage) or 1
(failure), never a traceback. In-process `deltatap` calls against real files."""

from __future__ import annotations

import json
import os

import pytest

from deltatap.app.cli import main
from tests.reports.test_cli import run_dir


def _one_line(capsys, command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"deltatap {command}: "), err
    return lines[0]


def test_out_that_is_a_file_or_cannot_be_created(tmp_path, capsys):
    run = run_dir(tmp_path / "run", 10.0)
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    for cmd in (["summary", str(run)], ["cascade", "--rows", str(run)], ["guardrails", "--runs", f"baseline={run}"]):
        capsys.readouterr()
        assert main([*cmd, "--quiet", "--out", str(a_file)]) == 1
        line = _one_line(capsys, cmd[0])
        assert str(a_file) in line and "not a directory" in line
    assert main(["summary", str(run), "--quiet", "--out", str(a_file / "sub")]) == 1
    assert str(a_file / "sub") in _one_line(capsys, "summary")


def test_verbose_keeps_the_traceback(tmp_path):
    run = run_dir(tmp_path / "run", 10.0)
    (tmp_path / "taken").write_text("x")
    with pytest.raises(OSError):
        main(["-vv", "summary", str(run), "--quiet", "--out", str(tmp_path / "taken")])


def test_binary_topology_yaml(tmp_path, capsys):
    run = run_dir(tmp_path / "run", 10.0)
    topo = tmp_path / "topology.yaml"
    topo.write_bytes(b"\xf6\x00\x81binary")
    assert main(["summary", str(run), "--quiet", "--topology", str(topo)]) == 2
    line = _one_line(capsys, "summary")
    assert str(topo) in line and "not a text file" in line


@pytest.mark.parametrize("flags", [["--duration", "nan"], ["--duration", "inf"], ["--duration", "1", "--grace-s", "nan"],
                                   ["--duration", "1", "--join-window-s", "inf"]])
def test_collect_refuses_nan_and_inf_seconds(tmp_path, capsys, flags):
    # before: --duration nan was a traceback (cannot convert float NaN to integer), --grace-s nan ran
    assert main(["collect", "--otlp-grpc", "none", "--otlp-http", "127.0.0.1:0", "--metrics", "none", "--out", str(tmp_path / "out"), *flags]) == 2
    assert flags[-2] in _one_line(capsys, "collect")
    assert not (tmp_path / "out").exists()


def test_sign_and_verify_name_a_directory_as_one(tmp_path, capsys):
    res = tmp_path / "result.json"
    res.write_text(json.dumps({"a": 1}))
    a_dir = tmp_path / "d"
    a_dir.mkdir()
    for cmd in (["sign", str(a_dir)], ["verify", str(a_dir)], ["sign", str(res), "--key", str(a_dir)]):
        capsys.readouterr()
        assert main(cmd) == 2  # before: "file not found" for a directory, and a FileExistsError traceback for --key DIR
        line = _one_line(capsys, cmd[0])
        assert str(a_dir) in line and "directory" in line
    assert not (tmp_path / "result.signed.json").exists()


def test_guardrails_flags_obey_the_config_constraints(tmp_path, capsys):
    run = run_dir(tmp_path / "run", 10.0)
    for bad in ("-1", "0", "nan"):
        capsys.readouterr()
        assert main(["guardrails", "--runs", f"baseline={run}", "--quiet", "--pause-threshold-ms", bad]) == 2
        assert "pause_threshold_ms" in capsys.readouterr().err
    assert main(["guardrails", "--runs", f"baseline={run}", "--quiet", "--pause-threshold-ms", "2.5"]) == 0


def test_guardrails_baseline_named_must_be_one_of_the_runs(tmp_path, capsys):
    """An explicit --baseline (or the YAML's baseline) that names no run was a note and exit 0; left out, a run set
    without a 'baseline' label still reports without overheads, with its note."""
    run = run_dir(tmp_path / "run", 10.0)
    capsys.readouterr()
    assert main(["guardrails", "--runs", f"a={run}", f"b={run}", "--baseline", "zz", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "baseline 'zz' is not one of the runs' labels (a, b)" in err
    cfg = tmp_path / "g.yaml"
    cfg.write_text(f"runs: {{a: {run}}}\nbaseline: zz\n")
    assert main(["guardrails", "--config", str(cfg), "--quiet"]) == 2
    assert "baseline 'zz' is not one of the runs' labels (a)" in capsys.readouterr().err
    assert main(["guardrails", "--runs", f"a={run}", f"b={run}", "--baseline", "a", "--quiet"]) == 0
    out = tmp_path / "o"
    assert main(["guardrails", "--runs", f"a={run}", f"b={run}", "--quiet", "--out", str(out)]) == 0
    assert "No run labelled 'baseline'" in (out / "guardrails-report.md").read_text()


def test_topology_with_empty_components_or_links_says_what_to_list(tmp_path, capsys):
    """``links:`` with nothing under it was 'Input should be a valid tuple'; a validator's message carries no
    'Value error, ' prefix."""
    topo = tmp_path / "t.yaml"
    topo.write_text("topology:\n  name: t\n  components:\n    - {name: client, kind: client}\n"
                    "    - {name: engine, kind: engine}\n  links:\n")
    capsys.readouterr()
    assert main(["cascade", "--topology", str(topo), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Value error" not in err
    assert "  - links: empty; list one per pair of neighbouring components, {name, downstream, upstream}" in err
    topo.write_text("topology:\n  name: t\n  components:\n  links: []\n")
    assert main(["cascade", "--topology", str(topo), "--quiet"]) == 2
    assert "  - components: empty; list the chain, client first, engine last" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [["compare", "RUN", "RUN"], ["demo"], ["bench", "ttft"]])
def test_out_that_is_a_file_is_refused_before_the_work(tmp_path, capsys, cmd):
    """compare resampled, demo and bench ran their stack and load, and only then found --out unwritable: refused
    first now (exit 2), with nothing started (the runs named are not even read)."""
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    capsys.readouterr()
    argv = [str(tmp_path / "no-such-run") if c == "RUN" else c for c in cmd]
    assert main([*argv, "--out", str(a_file)]) == 2
    line = _one_line(capsys, cmd[0])
    assert line == f"deltatap {cmd[0]}: --out {a_file}: already exists and is not a directory; name a directory, or a new path"


def test_a_folder_named_like_a_packaged_config_does_not_shadow_it(tmp_path, monkeypatch):
    """`deltatap demo --out demo` made ./demo; the next `deltatap demo` there read the folder as its config ('demo:
    cannot read (Is a directory)'). A folder is no config: the packaged one is found; a folder naming none is one line."""
    from deltatap.core.config import ConfigError, find_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    assert find_config("demo").is_file() and find_config("demo").name == "demo.yaml"
    (tmp_path / "mine").mkdir()
    with pytest.raises(ConfigError, match=r"^mine: a directory, and no packaged config has that name; name a YAML file"):
        find_config("mine")


def test_compare_caps_resamples(tmp_path, capsys):
    a, b = run_dir(tmp_path / "a", 10.0), run_dir(tmp_path / "b", 12.0)
    assert main(["compare", str(a), str(b), "--resamples", "200000", "--format", "json"]) == 2
    assert "--resamples 200000" in _one_line(capsys, "compare")


@pytest.mark.parametrize("flags,named", [(["--rate", "nan"], "--rate"), (["--rate", "5", "--concurrency", "2"], "contradict"),
                                         (["--requests", "0"], "--requests 0"), (["--capacity-rps", "inf"], "--capacity-rps")])
def test_bench_refuses_nan_zero_and_contradictory_loads(tmp_path, capsys, flags, named):
    # before: --rate nan was a traceback after the stack had started; --requests 0 and --rate 5 --concurrency 2 ran
    assert main(["bench", "ttft", "--quick", "--out", str(tmp_path / "b"), *flags]) == 2
    assert named in _one_line(capsys, "bench")
    assert not (tmp_path / "b").exists()


def test_selftest_checks_its_outputs_before_running(tmp_path, capsys):
    # before: the whole selftest ran, then --json failed with 'No such file or directory' (or --keep FILE was
    # reported as 'the reference stack did not run')
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    for flags, named in ((["--json", str(tmp_path / "missing" / "st.json")], "does not exist"), (["--json", str(tmp_path)], "a directory"),
                         (["--keep", str(a_file)], "not a directory")):
        capsys.readouterr()
        assert main(["selftest", "--referee", "off", *flags]) == 2
        line = _one_line(capsys, "selftest")
        assert flags[0] in line and named in line


def test_records_of_another_format_or_with_wrong_types(tmp_path, capsys):
    # before: `report --from` a record with a string time was a ValueError traceback; `summary --records` took
    # any JSON lines, and a record of format v99 was read as v1
    run = run_dir(tmp_path / "run", 10.0)
    good = {"v": 1, "request_id": "r1", "trace_id": "0" * 31 + "1", "span_id": "0" * 15 + "1", "phase": "measure", "status": "ok",
            "send_unix_ns": 1_700_000_000_000_000_000, "request_written_unix_ns": 1_700_000_000_000_100_000, "chunk_unix_ns": [],
            "end_unix_ns": 1_700_000_000_100_000_000}
    cases = (({"planned_send_unix_ns": "soon"}, "planned_send_unix_ns"), ({"v": 99}, "v99"), ({"chunk_unix_ns": [1.5]}, "chunk_unix_ns"))
    for change, named in cases:
        rec = tmp_path / "records.jsonl"
        rec.write_text(json.dumps({**good, **change}) + "\n")
        for cmd in (["report", "--from", str(rec), "--format", "json"], ["summary", str(run), "--quiet", "--records", str(rec)]):
            capsys.readouterr()
            assert main(cmd) == 2
            line = _one_line(capsys, cmd[0])
            assert str(rec) in line and named in line
    rec.write_text(json.dumps({"request_id": "r1", "status": "ok"}) + "\n")  # not a record at all
    assert main(["summary", str(run), "--quiet", "--records", str(rec)]) == 2
    assert "not a load-generator record" in _one_line(capsys, "summary")
    rec.write_text(json.dumps(good) + "\n")
    assert main(["summary", str(run), "--quiet", "--records", str(rec)]) == 0


def test_a_csv_that_is_not_a_rows_file(tmp_path, capsys):
    # before: any CSV (a header without deltatap's columns, or an empty file) was read as a run of 0 requests
    for text in ("a,b\n1,2\n", ""):
        rows = tmp_path / "rows.csv"
        rows.write_text(text)
        capsys.readouterr()
        assert main(["summary", str(rows), "--quiet"]) == 2
        assert "no trace_id column" in _one_line(capsys, "summary")


def test_a_json_document_where_json_lines_belong(tmp_path, capsys):
    # before: a report's pretty-printed JSON given as a rows file read "report.json:1: not JSON (Expecting property
    # name ...)" although it is valid JSON
    doc = tmp_path / "report.json"
    doc.write_text(json.dumps({"kind": "report", "sections": [1, 2]}, indent=2))
    assert main(["summary", str(doc), "--quiet"]) == 2
    line = _one_line(capsys, "summary")
    assert "one JSON document, not JSON lines" in line and "rows file" in line


def test_rows_of_another_schema_version(tmp_path, capsys):
    # before: rows without schema_version (or of another version) were read as version 1: a run of rows with no deltas
    run = run_dir(tmp_path / "run", 10.0)
    from deltatap.collector.sinks import read_rows, write_rows
    from deltatap.core.topology import default_topology

    rows = read_rows(run / "rows.parquet")
    write_rows(rows, tmp_path / "rows.jsonl", default_topology())
    lines = [json.loads(ln) for ln in (tmp_path / "rows.jsonl").read_text().splitlines()]
    for change, named in (({"schema_version": 99}, "schema_version 99"), ({"schema_version": None}, "schema_version missing")):
        bad = tmp_path / "bad" / "rows.jsonl"
        bad.parent.mkdir(exist_ok=True)
        bad.write_text("".join(json.dumps({**d, **change}) + "\n" for d in lines))
        capsys.readouterr()
        assert main(["summary", str(bad), "--quiet"]) == 2
        assert named in _one_line(capsys, "summary")
    assert main(["summary", str(tmp_path / "rows.jsonl"), "--quiet"]) == 0


def test_records_flag_given_a_directory(tmp_path, capsys):
    run = run_dir(tmp_path / "run", 10.0)
    assert main(["summary", str(run), "--quiet", "--records", str(tmp_path)]) == 2  # before: "file not found"
    assert "a directory; name its records.jsonl" in _one_line(capsys, "summary")
