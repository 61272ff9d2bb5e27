"""`/stats`: every turn's figures, and the chat's totals, as a table."""

from __future__ import annotations

from rich.table import Table

from app.chat.conversation import Conversation


def stats_table(conversation: Conversation, steady: bool = False) -> Table:
    table = Table(title="per turn", title_justify="left", box=None, padding=(0, 1), header_style="bold")
    columns = ["turn", "mode", "k", "tokens", "draft", "target", "offline", "rounds", "accept", "tok/round"]
    by_source = any("ngram" in (turn.reply.stats.get("by_source") or {}) for turn in conversation.turns)
    if by_source:  # n-gram drafting was on: acceptance by drafter, accepted/drafted
        columns += ["n-gram", "model"]
    if not steady:
        columns += ["tok/s", "1st token s", "verify s", "wire s"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("mode", "k") else "right")
    totals = dict(tokens=0, draft=0, target=0, offline=0, rounds=0, drafted=0, accepted=0, in_rounds=0)
    for turn in conversation.turns:
        reply, stats = turn.reply, turn.reply.stats
        counts = reply.counts()
        rounds, drafted, accepted = stats.get("rounds", 0), stats.get("drafted", 0), stats.get("accepted", 0)
        row = [str(turn.number), str(stats.get("mode", "-")), str(stats.get("k", "-")), str(len(reply.provenance)),
               str(counts["draft"]), str(counts["target"]), str(counts["offline"]), str(rounds),
               f"{accepted / drafted:.0%}" if drafted else "-",
               f"{len(reply.provenance) / rounds:.2f}" if rounds else "-"]
        if by_source:
            sources = stats.get("by_source") or {}
            row += [f"{sources[name]['accepted']}/{sources[name]['drafted']}" if name in sources else "-"
                    for name in ("ngram", "model")]
        if not steady:
            first = stats.get("first_token_s")
            row += [f"{stats['tokens_per_s']:.1f}" if stats.get("tokens_per_s") else "-",
                    "-" if first is None else f"{first:.2f}",
                    f"{stats.get('verify_s', 0):.2f}", f"{stats.get('wire_s', 0):.2f}"]
        table.add_row(*row)
        for key, value in (("tokens", len(reply.provenance)), ("draft", counts["draft"]),
                           ("target", counts["target"]), ("offline", counts["offline"]), ("rounds", rounds),
                           ("drafted", drafted), ("accepted", accepted),
                           ("in_rounds", len(reply.provenance) if rounds else 0)):  # a crash leaves no rounds
            totals[key] += value
    row = ["all", "", "", str(totals["tokens"]), str(totals["draft"]), str(totals["target"]),
           str(totals["offline"]), str(totals["rounds"]),
           f"{totals['accepted'] / totals['drafted']:.0%}" if totals["drafted"] else "-",
           f"{totals['in_rounds'] / totals['rounds']:.2f}" if totals["rounds"] else "-"]
    if by_source:
        row += [_source_total(conversation, name) for name in ("ngram", "model")]
    if not steady:
        row += ["", "", "", ""]
    table.add_row(*row, style="bold")
    return table


def _source_total(conversation: Conversation, source: str) -> str:
    """accepted/drafted of one drafter over every turn."""
    accepted = drafted = 0
    for turn in conversation.turns:
        counts = (turn.reply.stats.get("by_source") or {}).get(source)
        if counts:
            accepted, drafted = accepted + counts["accepted"], drafted + counts["drafted"]
    return f"{accepted}/{drafted}" if drafted else "-"
