"""`specwire chat`: check the flags, find the models and the saved chat, then run the app.

What can be known before the screen opens is checked here and reported as a one-line
error (a draft model that is not there, a bad flag, an unknown chat id). Logging goes to
a file while the app runs: a log line on stderr would tear the screen.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import time
from pathlib import Path

from app.chat.chat_config import FROM_CONFIG, chat_defaults
from app.chat.settings import ChatSettings
from app.chat.store import ChatInUse, ChatNotFound, ChatStore, private_folder
from app.generation_flags import drafting, sampling_params
from app.model_paths import resolve_model
from app.tokenizer_source import tokenizer_path
from app.token_file import read_token_file
from app.user_error import UserError
from wire.visible_text import escaped


KEEP_LOGS = 20  # the newest chats' logs are kept; older ones are removed when a chat starts


def log_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "specwire" / "chat-logs"


def log_to_file(verbose: int) -> Path:
    """Log into a file of this process's own: two chats at once would interleave their lines in one."""
    folder = private_folder(log_dir())  # a chat's log names its files and quotes its service
    logs = sorted(folder.glob("chat-*.log"), key=lambda p: p.name)  # named by their start: oldest first
    for old in logs[: max(0, len(logs) - (KEEP_LOGS - 1))]:
        for each in (old, old.with_name(old.name + ".1")):  # with its rotated part
            each.unlink(missing_ok=True)
    path = folder / f"chat-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=5_000_000, backupCount=1, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
    return path


def list_chats(store: ChatStore) -> int:
    summaries = store.list()
    if not summaries:
        print(f"no saved chats in {store.root}")
        return 0
    width = max(len(s.id) for s in summaries)
    print(f"{'ID':{width}}  {'STARTED':16}  TURNS  FIRST MESSAGE")
    for s in summaries:
        print(f"{escaped(s.id):{width}}  {escaped(s.created[:16]).replace('T', ' '):16}  {s.turns:5d}  "
              f"{escaped(s.title[:60])}")
    print(f"\nspecwire chat --resume ID continues one ({store.root})")
    return 0


def settings_from(args: argparse.Namespace, store: ChatStore) -> ChatSettings:
    defaults = chat_defaults()
    args = argparse.Namespace(**vars(args))  # the flags given, the config file's [chat] for the others
    if args.k is FROM_CONFIG:
        args.k = defaults.k
    if args.temperature is FROM_CONFIG:
        args.temperature = defaults.temperature
    if args.system is None:
        args.system = defaults.system
    params = sampling_params(args)
    problems = [f"--max-tokens must be 1 or more, got {args.max_tokens}"] if args.max_tokens < 1 else []
    problems += [f"--context must be 64 or more, got {args.context}"] if args.context < 64 else []
    if problems:
        raise UserError("; ".join(problems))
    how = drafting(args)
    if how == "ngram":  # no model: a vocabulary to tokenize with, the pair's unless --tokenizer names one
        if args.offline:
            raise UserError("--draft ngram has no local model to generate with: it cannot start --offline")
        # a remote service's own vocabulary first; the embedded one's pair is on this machine
        draft = tokenizer_path(args.tokenizer, args.pair, args.server, read_token_file(args.token_file),
                               args.ca_file)
        if not draft.is_file():
            raise UserError(f"there is no tokenizer GGUF at {draft} (--tokenizer)")
    else:
        draft = Path(resolve_model(args.draft, args.pair, "draft"))  # names the fetch command when it is missing
        if not draft.is_file():  # a --draft path: said now, before the target loads for nothing
            raise UserError(f"there is no draft model at {draft} (--draft)")
    target, target_problem = embedded_target(args)
    try:
        resume = store.path_of(args.resume or None) if args.resume is not None else None
    except (ChatNotFound, ChatInUse) as exc:
        raise UserError(str(exc)) from exc
    return ChatSettings(
        draft=draft, drafting=how, target=target, target_problem=target_problem, pair=args.pair, backend=args.backend, server=args.server,
        token=read_token_file(args.token_file), ca_file=args.ca_file, offline=args.offline, mode=args.mode, k=args.k,
        params=params, seed=args.seed, system=args.system, max_tokens=args.max_tokens, context=args.context,
        draft_gpu_layers=args.draft_gpu_layers, draft_threads=args.draft_threads, resume=resume, chats_dir=store.root,
        marks=defaults.marks)


def embedded_target(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(the embedded service's target, None) or (None, why there is none).

    A missing target is not an error here: the chat starts, and offers to go on offline
    with the drafter alone when the service would start.
    """
    if args.server:
        return None, None  # a remote service: its target is its own business
    try:
        return resolve_model(args.target, args.pair, "target"), None
    except UserError as exc:
        return None, str(exc)


def run_chat(args: argparse.Namespace) -> int:
    store = ChatStore()
    if args.list:
        return list_chats(store)
    settings = settings_from(args, store)
    logged_to = log_to_file(args.verbose)
    from app.chat.chat_app import ChatApp  # Textual loads only for the app itself

    app = ChatApp(settings)
    app.run()
    chat_id = app.engine.conversation.chat_id
    if chat_id:
        print(f"chat {chat_id} saved; continue it with: specwire chat --resume {chat_id}")
    if app.return_code:
        print(f"(the log is in {logged_to})")
    return app.return_code or 0
