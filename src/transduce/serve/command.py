"""``transduce serve``: its command line, LibreTranslate's ``LT_*`` variables, and running uvicorn.

    transduce serve --model DIR                   one model directory
    transduce serve --models models.toml          several, routed by language pair (see registry.py)
    transduce serve --models DIR_OF_MODELS        every model directory in DIR_OF_MODELS
    transduce serve --suggestions FILE --export-suggestions OUT.tsv   suggestions as fine-tuning data

The app itself is :func:`transduce.serve.server.create_app`.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

from ..backends.options import add_backend_arguments, backend_from_args
from ..decode.search_options import SearchOptions, add_search_arguments, as_flags
from .files import FileStore, default_folder
from .keys import Access, read_keys
from .registry import ModelSpec, read_models
from .replicas import KINDS, worker_kind
from .server import create_app
from .service import Settings, usable_cores, worker_count
from .suggestions import Store


def lt_env(name: str, default):
    """The default of an option LibreTranslate reads from ``LT_<NAME>`` (so its docker settings carry over):
    that variable's value when set; LibreTranslate's -1 ("no limit", "default") gives transduce's default.
    A malformed value becomes a message that argparse's conversion then reports, naming the variable."""
    value = os.environ.get(f"LT_{name}")
    if value is None:
        return default
    if isinstance(default, str):
        return value
    try:
        number = int(value)
    except ValueError:
        return f"environment variable LT_{name}: expected a whole number, got {value!r}"
    return default if number == -1 else number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Settings()
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", type=Path, help="one model directory")
    which.add_argument(
        "--models",
        type=Path,
        help="a models TOML ([[model]] path/source/target) or a directory "
        "of model directories whose [meta] names src_lang/tgt_lang",
    )
    parser.add_argument("--host", default=lt_env("HOST", "127.0.0.1"), help="address to bind (default: localhost only)")
    parser.add_argument("--port", type=int, default=lt_env("PORT", 8080))
    parser.add_argument("--device", default="cpu")
    add_backend_arguments(parser)
    _add_workers(parser, d)
    parser.add_argument(
        "--memory-budget-mb",
        type=float,
        default=0,
        help="with --models: MiB of loaded models; the least recently used idle ones are unloaded "
        "to load another (default 0: no limit)",
    )
    parser.add_argument(
        "--api-keys",
        type=Path,
        default=None,
        help="file of API keys, one per line: KEY [REQUESTS_PER_MINUTE [CHAR_LIMIT]]",
    )
    parser.add_argument(
        "--cors-origins",
        default="*",
        help="comma-separated origins browsers may call from (default '*', any; '' sends no CORS headers)",
    )
    _add_suggestions_and_files(parser)
    parser.add_argument(
        "--char-limit",
        type=int,
        default=lt_env("CHAR_LIMIT", d.char_limit),
        help="characters per LibreTranslate request, all texts together (default 0: no limit)",
    )
    parser.add_argument(
        "--require-api-key",
        choices=("remote", "always"),
        default="remote",
        help="with --api-keys: who must send a key (default: clients not on this machine)",
    )
    parser.add_argument(
        "--key-limit",
        type=int,
        default=0,
        help="requests per minute for keys without their own number (default 0: no limit)",
    )
    parser.add_argument(
        "--req-limit",
        type=int,
        default=lt_env("REQ_LIMIT", 0),
        help="requests per minute per client address without a key (default 0: no limit)",
    )
    search = parser.add_argument_group("search of the LibreTranslate API and the page (α 0: no length penalty)")
    add_search_arguments(search, modes=(), lengths=False)
    _add_limits(parser, d)


def _add_workers(parser: argparse.ArgumentParser, d: Settings) -> None:
    """How many batches are decoded at once, by what kind of worker, on how many threads."""
    parser.add_argument(
        "--workers",
        type=int,
        default=d.workers,
        help="batches decoded at once (default 0: one per --threads of the cores this process may use)",
    )
    parser.add_argument(
        "--worker-kind",
        choices=KINDS,
        default="auto",
        help="process: each worker a process with its own copy of the model (more memory, no shared GIL); "
        "thread: workers share the server process's copy and Python's GIL; auto (default): processes from "
        "3 workers on the CPU",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=lt_env("THREADS", d.threads),
        help="torch intra-op threads of each worker (default 1)",
    )
    parser.add_argument(
        "--lone-threads",
        type=int,
        default=d.lone_threads,
        help="intra-op threads of a thread worker's batch when no other batch is running or queued (default 0: "
        "all the workers' threads for models of d_model 512 and wider, where a lone request decodes faster on "
        "every core; one worker's for narrower ones)",
    )


def _add_suggestions_and_files(parser: argparse.ArgumentParser) -> None:
    """Where suggestions and translated files are kept."""
    parser.add_argument(
        "--suggestions",
        type=Path,
        default=None,
        help="an SQLite file that keeps the translations users suggest (POST /suggest); off without it",
    )
    parser.add_argument(
        "--export-suggestions",
        type=Path,
        default=None,
        metavar="TSV",
        help="with --suggestions: write them as SOURCE<TAB>TARGET lines (transduce prepare files --tsv) and exit",
    )
    parser.add_argument(
        "--export-pair", default="", metavar="SRC:TGT", help="with --export-suggestions: only this pair's"
    )
    parser.add_argument(
        "--files-dir",
        type=Path,
        default=None,
        help="where translated files are kept until they expire (default: a folder in the system's temp folder)",
    )
    parser.add_argument(
        "--file-expiry", type=float, default=1800, help="seconds a translated file stays downloadable (default 1800)"
    )
    parser.add_argument(
        "--disable-files-translation", action="store_true", help="no POST /translate_file (LibreTranslate's flag)"
    )


def _add_limits(parser: argparse.ArgumentParser, d: Settings) -> None:
    """The server's limits per request and its batching (defaults: ``d``)."""
    parser.add_argument(
        "--max-sentences",
        "--batch-limit",
        dest="max_sentences",
        type=int,
        default=lt_env("BATCH_LIMIT", d.max_sentences),
        help="texts per request (LibreTranslate's --batch-limit)",
    )
    parser.add_argument("--max-chars", type=int, default=d.max_chars, help="characters per sentence")
    parser.add_argument("--max-body", type=int, default=d.max_body, help="request body bytes")
    parser.add_argument("--max-beam", type=int, default=d.max_beam)
    parser.add_argument("--timeout", type=float, default=d.timeout, help="seconds per request")
    parser.add_argument(
        "--wait-ms",
        type=float,
        default=d.wait_ms,
        help="how long a worker waits for more requests to batch, only when others are queued (default 0: it takes what is queued)",
    )
    parser.add_argument("--batch-tokens", type=int, default=d.batch_tokens, help="source tokens per batch")
    parser.add_argument(
        "--max-batch-requests",
        type=int,
        default=d.max_batch_requests,
        help="requests per batch (1 disables dynamic batching)",
    )
    parser.add_argument(
        "--access-log",
        action="store_true",
        help="a line per request on stderr, as uvicorn logs them (default: off, as LibreTranslate; "
        "/metrics counts requests)",
    )
    parser.add_argument(
        "--graceful-timeout",
        type=float,
        default=None,
        help="seconds to wait for in-flight requests on shutdown (default: no limit)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    s = Settings(**{key: getattr(args, key) for key in vars(Settings())})
    for key, value in vars(s).items():
        if isinstance(value, str):  # worker_kind: argparse's choices
            continue
        zero = key in ("wait_ms", "char_limit", "workers", "lone_threads", "alpha")  # 0: none, none, auto, auto, none
        if value < 0 or (value == 0 and not zero):
            must = "must not be negative" if zero else "must be positive"
            raise ValueError(f"--{key.replace('_', '-')} {must}, got {value}")
    with as_flags():  # the server's own search, within the limits it holds requests to
        SearchOptions.from_request({"beam": s.beam, "alpha": s.alpha}, max_beam=s.max_beam)
    for key in ("memory_budget_mb", "key_limit", "req_limit"):
        if getattr(args, key) < 0:
            raise ValueError(f"--{key.replace('_', '-')} must not be negative, got {getattr(args, key)}")
    return s


def access_from_args(args: argparse.Namespace) -> Access:
    if args.api_keys is None:
        return Access([], require="never", anonymous_limit=args.req_limit)
    return Access(read_keys(args.api_keys, args.key_limit), args.require_api_key, args.req_limit)


def export_suggestions(args: argparse.Namespace) -> int:
    if args.suggestions is None or not args.suggestions.is_file():
        raise FileNotFoundError(
            f"--export-suggestions needs --suggestions FILE (an existing file), got {args.suggestions}"
        )
    source, _, target = args.export_pair.partition(":")
    if args.export_pair and not (source and target):
        raise ValueError(f"--export-pair must be SRC:TGT, got {args.export_pair!r}")
    store = Store(args.suggestions)
    n = store.export(args.export_suggestions, source or None, target or None)
    store.close()
    print(f"transduce serve: wrote {n} suggestions to {args.export_suggestions}")
    return 0


def run(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from ..api import load

    if args.export_suggestions is not None:
        return export_suggestions(args)
    if args.model is None and args.models is None:
        raise ValueError("give --model DIR or --models FILE_OR_DIR")
    settings = settings_from_args(args)
    access = access_from_args(args)
    cors = tuple(o.strip() for o in args.cors_origins.split(",") if o.strip())
    suggestions = Store(args.suggestions) if args.suggestions is not None else None
    if args.file_expiry <= 0:
        raise ValueError(f"--file-expiry must be positive, got {args.file_expiry}")
    files = False if args.disable_files_translation else FileStore(args.files_dir or default_folder(), args.file_expiry)
    torch.set_num_threads(settings.threads)
    workers = worker_count(settings)
    backend = backend_from_args(args)
    if args.model is not None:
        translator = load(args.model, device=args.device, backend=backend)
        print(f"transduce serve: {translator.fast_paths.line()}", flush=True)
        kind, why = worker_kind(settings.worker_kind, workers, translator.origin)
        print(
            f"transduce serve: {workers} {kind} worker(s) x {settings.threads} thread(s) ({usable_cores()} usable "
            f"cores): {why}",
            flush=True,
        )
        app = create_app(
            translator,
            settings,
            name=Path(args.model).name,
            access=access,
            cors_origins=cors,
            suggestions=suggestions,
            files=files,
        )
    else:
        specs = read_models(args.models)

        def load_spec(spec: ModelSpec):
            from ..backends import requested_backend

            # a model's own dtype (its line in --models) names its backend; else the server's options
            chosen = backend if spec.dtype is None else requested_backend("auto", spec.dtype, args.native)
            translator = load(spec.path, device=args.device, backend=chosen)
            print(f"transduce serve: {spec.name}: {translator.fast_paths.line()}", flush=True)
            return translator

        app = create_app(
            settings=settings,
            specs=specs,
            access=access,
            load=load_spec,
            budget_bytes=int(args.memory_budget_mb * 2**20),
            cors_origins=cors,
            suggestions=suggestions,
            files=files,
        )
    gc.freeze()  # what is loaded by now is never garbage: the collector stops walking it at every collection
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            timeout_graceful_shutdown=args.graceful_timeout,
            log_level="info",
            access_log=args.access_log,  # its formatting took ~7% of the HTTP thread under 8 clients (py-spy)
            ws="none",  # no websocket routes: the websockets library is neither imported nor offered
        )
    finally:  # the models' workers (threads, processes) end with the command, however uvicorn ended
        app.state.pool.stop()
    return 0
