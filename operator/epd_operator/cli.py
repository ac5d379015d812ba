"""`epdctl`: render, validate and publish the EPDDeployment API from the command line.

It calls exactly what the operator calls (`parse_epd`, `render`), so what `epdctl render` prints is
what the operator would apply.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from . import __version__
from .api import GROUP, SpecError, parse_epd
from .api.crd import build_crd
from .api.router import DEFAULT_ROUTER_IMAGE


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)


def dump_yaml(objects: Iterable[dict[str, Any]]) -> str:
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False, explicit_start=True)


def _read_documents(path: str) -> list[dict[str, Any]]:
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115 (closed by the with below)
    with stream:
        docs = [doc for doc in yaml.safe_load_all(stream) if doc is not None and not _other_api(doc)]
    if not docs:
        raise SpecError([])
    return docs


def _other_api(doc: Any) -> bool:
    """A document of another API group (a Namespace, a PVC, ... applied beside the EPDDeployment in one
    file), which epdctl leaves alone; a document of this group with another kind is still refused."""
    api_version = doc.get("apiVersion") if isinstance(doc, dict) else None
    return isinstance(api_version, str) and api_version.split("/")[0] != GROUP and "kind" in doc


def _parse_all(path: str) -> list:
    """Every EPDDeployment in the file, or exit 1 naming each bad field (and printing nothing else)."""
    return [epd for _doc, epd in _parse_documents(path)]


def _parse_documents(path: str) -> list[tuple[dict[str, Any], Any]]:
    """(document, parsed EPDDeployment) for each document, or exit 1 as `_parse_all` does."""
    try:
        docs = _read_documents(path)
    except (OSError, yaml.YAMLError) as exc:
        print(f"epdctl: {path}: {exc}", file=sys.stderr)
        sys.exit(1)
    except SpecError:
        print(f"epdctl: {path}: no EPDDeployment in the file", file=sys.stderr)
        sys.exit(1)
    parsed, failed = [], False
    for index, doc in enumerate(docs):
        name = (
            doc.get("metadata", {}).get("name", f"document {index}") if isinstance(doc, dict) else f"document {index}"
        )
        try:
            parsed.append((doc, parse_epd(doc)))
        except SpecError as exc:
            failed = True
            for error in exc.errors:
                print(f"epdctl: {path}: EPDDeployment {name}: {error}", file=sys.stderr)
    if failed:
        sys.exit(1)
    return parsed


def cmd_render(args: argparse.Namespace) -> None:
    from .render import render

    objects, failed = [], False
    for epd in _parse_all(args.file):
        if args.namespace:
            epd.metadata.namespace = args.namespace
        try:
            objects.extend(
                render(
                    epd,
                    default_router_image=args.router_image,
                    default_prometheus_address=args.keda_prometheus_address,
                )
            )
        except SpecError as exc:  # what only rendering can tell (a KEDA tier with no Prometheus to query)
            failed = True
            for error in exc.errors:
                print(f"epdctl: {args.file}: EPDDeployment {epd.name}: {error}", file=sys.stderr)
    if failed:
        sys.exit(1)
    sys.stdout.write(dump_yaml(objects))


def cmd_validate(args: argparse.Namespace) -> None:
    documents = _parse_documents(args.file)
    for _doc, epd in documents:
        print(f"EPDDeployment {epd.name}: valid ({epd.spec.topology}, EC connector {epd.spec.ecTransfer.connector})")
    if args.server and not asyncio.run(_validate_on_server(args, [doc for doc, _epd in documents])):
        sys.exit(1)


async def _validate_on_server(args: argparse.Namespace, docs: list[dict[str, Any]]) -> bool:
    """A server-side dry-run apply of each document: what the cluster itself says — the CRD version
    installed there, admission policies, quotas, permissions — with nothing persisted."""
    from .kube import ApiError, CredentialsError, Kube, load_credentials

    async with Kube(lambda: load_credentials(args.kubeconfig, args.context)) as kube:
        try:
            login = await kube.login()
        except CredentialsError as exc:
            print(f"epdctl: {exc}", file=sys.stderr)
            return False
        accepted = True
        for doc in docs:
            meta = doc["metadata"]  # parse_epd accepted it: it has metadata with a name
            meta["namespace"] = meta.get("namespace") or args.namespace or login.default_namespace or "default"
            what = f"EPDDeployment {meta['namespace']}/{meta['name']}"
            try:
                await kube.apply(doc, field_manager="epdctl", dry_run=True)
            except ApiError as exc:
                accepted = False
                message = exc.body.get("message") if isinstance(exc.body, dict) else str(exc)
                print(
                    f"epdctl: {args.file}: {what}: refused by {login.server} ({exc.status} {exc.reason}): {message}",
                    file=sys.stderr,
                )
                for cause in exc.causes:  # one per refused field; a cause naming none repeats the message
                    if cause.get("field"):
                        print(f"  {cause['field']}: {cause.get('message')}", file=sys.stderr)
            except (TimeoutError, OSError) as exc:  # aiohttp's connection errors are OSErrors
                print(f"epdctl: {login.server}: {exc}", file=sys.stderr)
                return False
            else:
                print(f"{what}: accepted by {login.server} (dry run, nothing changed)")
        return accepted


def cmd_crd(_: argparse.Namespace) -> None:
    sys.stdout.write(dump_yaml([build_crd()]))


def cmd_docs(args: argparse.Namespace) -> None:
    from .api.docs import reference, with_reference

    if args.output is None:
        sys.stdout.write(reference())
        return
    page = Path(args.output)
    try:
        page.write_text(with_reference(page.read_text(encoding="utf-8")), encoding="utf-8")
    except (OSError, ValueError) as error:
        raise SystemExit(f"epdctl docs: {page}: {error}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epdctl", description="Work with EPDDeployment specs (serving.epd.dev/v1alpha1)."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser(
        "render", help="print the Kubernetes objects an EPDDeployment becomes (multi-document YAML)"
    )
    render.add_argument(
        "-f",
        "--file",
        required=True,
        help="YAML file with EPDDeployments ('-' for stdin); documents of other API groups are skipped",
    )
    render.add_argument("-n", "--namespace", help="namespace to render into (default: the spec's, else 'default')")
    render.add_argument(
        "--router-image",
        default=DEFAULT_ROUTER_IMAGE,
        help=f"router/janitor image when the spec names none (the operator's --router-image; default {DEFAULT_ROUTER_IMAGE})",
    )
    render.add_argument(
        "--keda-prometheus-address",
        metavar="URL",
        help="the Prometheus a KEDA-scaled tier's load trigger queries when its spec names none "
        "(the operator's --keda-prometheus-address)",
    )
    render.set_defaults(func=cmd_render)
    validate = sub.add_parser("validate", help="check EPDDeployment specs; exit 1 naming each bad field")
    validate.add_argument(
        "-f",
        "--file",
        required=True,
        help="YAML file with EPDDeployments ('-' for stdin); documents of other API groups are skipped",
    )
    validate.add_argument(
        "--server",
        action="store_true",
        help="also ask the cluster: a server-side dry-run apply (its installed CRD, admission "
        "policies, quotas, permissions); nothing is changed",
    )
    validate.add_argument(
        "-n", "--namespace", help="with --server: namespace of specs that name none (default: the kubeconfig context's)"
    )
    validate.add_argument(
        "--kubeconfig", help="with --server: kubeconfig path(s) (default: in-cluster, else $KUBECONFIG)"
    )
    validate.add_argument("--context", help="with --server: kubeconfig context (default: the current one)")
    validate.set_defaults(func=cmd_validate)
    crd = sub.add_parser("crd", help="print the generated CustomResourceDefinition")
    crd.set_defaults(func=cmd_crd)
    docs = sub.add_parser(
        "docs", help="print the Markdown reference of every spec field (docs/api.md's field reference)"
    )
    docs.add_argument(
        "-o",
        "--output",
        help="rewrite the reference in this Markdown file, between its api-reference markers (docs/api.md)",
    )
    docs.set_defaults(func=cmd_docs)
    # Listed for --help only: main() hands `epdctl janitor ...` to the janitor's own parser.
    sub.add_parser(
        "janitor", help="bound a shared-storage encoder cache (runs as a sidecar; see `epdctl janitor --help`)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["janitor"]:  # its flags are the janitor's own; argparse.REMAINDER would refuse `--path`
        from .janitor import main as janitor_main

        return janitor_main(argv[1:])
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
