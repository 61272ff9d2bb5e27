"""Which model file a command uses: the one named by a flag, else that of the chosen pair."""

from __future__ import annotations

from app.user_error import UserError


def resolve_model(explicit: str | None, pair_name: str | None, role: str) -> str:
    """`explicit` if given, else the `role` ("draft" or "target") of the pair (or the default pair).

    A missing file is a UserError that names the fetch command; a user's own pair is used
    only when its draft and target share one vocabulary.
    """
    from models.registry import RegistryError, check_vocabularies, get_pair, require_file

    if explicit:
        return explicit
    try:
        pair = get_pair(pair_name)
        path = require_file(pair, getattr(pair, role))
        if pair.draft.is_local or pair.target.is_local:
            check_vocabularies(pair)  # a user's pair is accepted only with one vocabulary
        return str(path)
    except RegistryError as exc:
        raise UserError(str(exc)) from exc
