"""Validate a `deltatap` command line without starting it: the argument parser, then what each command
checks before it serves (its options, config files, workload, OTLP endpoints). Shared by the compose
and docs tests. Paths are resolved against the repository (the image's WORKDIR holds configs/)."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import pytest

from deltatap.app.cli import build_parser
from deltatap.core.config import find_config, validate
from deltatap.telemetry.tracer import make_exporter
from deltatap.core.topology import load_topology, parse_hostport

ROOT = Path(__file__).resolve().parents[2]
IMAGE_WORKDIR = Path("/opt/deltatap")


def repo_path(p: str) -> Path:
    """A config path as a command sees it (relative to the repo root or the image's WORKDIR) -> the file here."""
    path = Path(p)
    if path.is_absolute():
        path = path.relative_to(IMAGE_WORKDIR)
    if path.parts[0] != "configs":
        return find_config(p)  # a packaged config's name (`--config demo`): shipped inside the package
    return ROOT / path


def parse(cmd: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(cmd)
        except SystemExit:
            pytest.fail(f"`deltatap {' '.join(cmd)}` is rejected by the parser:\n{err.getvalue()}")


def _check_otlp(value: str | None) -> None:
    exporter = make_exporter(value)  # raises TelemetryConfigError for a bad endpoint; connects lazily
    exporter.shutdown()


def check_tap(args: argparse.Namespace) -> None:
    from deltatap.proxy.cli import build_options

    if args.config:
        args.config = str(repo_path(args.config))
    if args.tls_cert and args.tls_key and not Path(args.tls_cert).exists():
        # the docs make the pair with openssl first (docs/tap.md "TLS toward the client"): one like it, here
        args.tls_cert, args.tls_key = _doc_tls_pair(args.tls_cert, args.tls_key)
    build_options(args)
    _check_otlp(args.otlp)


def _doc_tls_pair(cert: str, key: str) -> tuple[str, str]:
    """A self-signed pair under the names the doc's openssl line gives them (made with ``cryptography``)."""
    import datetime
    import tempfile

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
         .sign(k, hashes.SHA256()))
    d = Path(tempfile.mkdtemp(prefix="deltatap-doc-tls-"))
    (d / Path(cert).name).write_bytes(c.public_bytes(serialization.Encoding.PEM))
    (d / Path(key).name).write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    return str(d / Path(cert).name), str(d / Path(key).name)


def check_collect(args: argparse.Namespace) -> None:
    from deltatap.collector.service import CollectorOptions

    topo = load_topology(repo_path(args.topology) if args.topology else None)
    CollectorOptions(
        otlp_grpc=args.otlp_grpc, otlp_http=args.otlp_http, metrics=args.metrics, topology=topo,
        out_dir=args.out, rows_format=args.rows_format, forward=args.forward, reexport=args.reexport,
    ).check()
    if args.forward:
        _check_otlp(args.forward)


def check_stack(args: argparse.Namespace) -> None:
    from deltatap.stack import load_component_config, load_stack_config

    if args.component == "all":
        load_stack_config(repo_path(args.config))
        _check_otlp(args.otlp)
        return
    cfg = load_component_config(repo_path(args.config), args.component)
    if args.listen:
        parse_hostport(args.listen)
    if args.upstream:  # what `stack --upstream` does: replace the firewall's upstream / every route's
        data = cfg.model_dump()
        if args.component == "firewall":
            data["upstream"] = args.upstream
        else:
            data["routes"] = [{**r, "upstreams": [args.upstream]} for r in data["routes"]]
        validate(type(cfg), data, f"--upstream {args.upstream}")
    _check_otlp(args.otlp)


def check_load(args: argparse.Namespace) -> None:
    """What `deltatap load` builds before it sends anything: LoadOptions, then the workload."""
    from deltatap.loadgen.options import LoadOptions
    from deltatap.loadgen.run import resolve_workload

    fields = {k: getattr(args, k) for k in LoadOptions.model_fields if getattr(args, k, None) is not None}
    fields.update(headers=dict(args.header), labels=dict(args.label))
    if isinstance(fields.get("workload"), str) and fields["workload"].endswith((".yaml", ".yml")):
        fields["workload"] = str(repo_path(fields["workload"]))
    options = validate(LoadOptions, fields, "deltatap load")
    resolve_workload(options)
    _check_otlp(args.otlp)


def check_summary(args: argparse.Namespace) -> None:
    if args.topology:
        load_topology(repo_path(args.topology))


def check_compare(args: argparse.Namespace) -> None:
    from deltatap.collector.compare.stats import Threshold

    Threshold.parse(args.threshold)  # raises ValueError with the one line the command prints
    assert all(0 <= q <= 100 for q in args.percentiles) and 0 < args.confidence < 1 and args.resamples >= 100


def check_selftest(args: argparse.Namespace) -> None:
    from deltatap.app.accuracy import WARMUP

    assert args.requests > WARMUP and 0 < args.rate <= 500


def check_bench(args: argparse.Namespace) -> None:
    from deltatap.app.bench.cli import check_args

    if args.stack:
        args.stack = str(repo_path(args.stack))
    if args.topology:
        args.topology = str(repo_path(args.topology))
    check_args(args)  # formats, SLOs, flags that go together, the stack config or topology


COMMAND_CHECKS: dict[str, Callable[[argparse.Namespace], None]] = {
    "tap": check_tap,
    "collect": check_collect,
    "stack": check_stack,
    "load": check_load,
    "summary": check_summary,
    "demo": lambda args: None,  # its only input is the packaged config, validated by its own tests
    "bench": check_bench,
    "compare": check_compare,
    "selftest": check_selftest,
    "sign": lambda args: None,  # its input is a result file the command itself reads and reports on
    "verify": lambda args: None,
}


def check_command(cmd: list[str]) -> argparse.Namespace:
    """Parse and validate; returns the parsed arguments. Fails the test for a command with no check."""
    args = parse(cmd)
    check = COMMAND_CHECKS.get(cmd[0])
    assert check is not None, f"`deltatap {cmd[0]}` has no validation in tests/deploy/commands.py"
    check(args)
    return args
