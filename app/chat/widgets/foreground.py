"""A component's text style without its background, for styled runs inside a widget's text.

A widget's full component style carries the background of the theme in use when the text
was built; a run that keeps it shows a dark band under a lighter theme (and after a theme
change). The partial style leaves translucent colours ($text-muted) unblended, so the full
style is taken and its background dropped.
"""

from __future__ import annotations

from rich.style import Style
from textual.widget import Widget


def foreground_style(widget: Widget, component: str) -> Style:
    full = widget.get_component_rich_style(component)
    return Style(color=full.color, bold=full.bold, dim=full.dim, italic=full.italic, underline=full.underline,
                 strike=full.strike, reverse=full.reverse)
