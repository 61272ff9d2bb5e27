"""Chat templates from GGUF files: rendered in a sandbox, ChatML when missing or broken."""

from __future__ import annotations

import pytest

from local_draft.chat_template import CHATML, ChatTemplate, ChatTemplateError, Message, template_for


def test_the_tiny_drafts_template_renders_chatml(close_draft):
    """The tiny models carry a ChatML template: the prompt ends with the assistant's header."""
    template = template_for(close_draft.chat_template, "<|begin|>", "<|endoftext|>")
    assert not template.is_fallback
    text = template.render([Message("system", "be brief"), Message("user", "hi")])
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_missing_or_broken_template_falls_back_to_chatml(caplog):
    """No template, one that does not compile, one that fails on a conversation: ChatML, logged."""
    assert template_for(None, "", "").source == CHATML
    broken = template_for("{% for m in messages %}", "", "")
    assert broken.is_fallback and "does not compile" in caplog.text
    failing = template_for("{{ messages[5]['content'] }}", "", "")
    assert failing.is_fallback


def test_templates_get_the_helpers_real_ones_use():
    """raise_exception refuses clearly; bos/eos tokens and tojson are there; the sandbox holds."""
    template = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}"
                            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}",
                            bos_token="<s>")
    assert template.render([Message("user", "é")]).startswith('<s>{"role": "user", "content": "é"}')
    with pytest.raises(ChatTemplateError, match="user first"):
        template.render([Message("assistant", "x")])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])


@pytest.mark.timeout(120)  # today's renderer spins for hours on the nested loops: this fails it instead
@pytest.mark.parametrize("source, words", [
    ("{{ 'x' * 10**20 }}", "a sequence of 1 times 100000000000000000000"),  # OverflowError escaped
    ("{{ 'x' * 10**9 }}", "a sequence of 1 times 1000000000"),  # a 1 GB string
    ("{{ [0] * 10**9 }}", "a sequence of 1 times 1000000000"),
    ("{{ 'x'|center(10**9) }}", "the filter center with a width or count that large"),
    ("{{ 'x'.ljust(10**9) }}", "ljust with a count that large"),
    ("{{ '%999999999d' % 1 }}", "a % format that wide"),
    ("{{ '%999999999d'|format(1) }}", "a format that wide"),
    ("{{ '{:>999999999}'.format(1) }}", "a format that wide"),
    ("{{ 7 ** 1000000000 }}", "7 \\*\\* 1000000000"),  # jinja: 7 ** 10 ** 9 is (7 ** 10) ** 9
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "loops too long"),
    ("{% set ns = namespace(s='x') %}{% for i in range(31) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s[:1] }}",
     "MiB of memory to render|loops too long"),
    ("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", "a prompt that long|loops too long"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),  # escaped today
])
def test_a_template_that_would_hang_or_exhaust_memory_ends_in_a_clear_error(source, words):
    """A template is data from a file (a service's, for --draft ngram): each of these ends within
    seconds in a ChatTemplateError, not a hang, an OverflowError, a MemoryError or the OOM killer."""
    import time

    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=words):
        ChatTemplate(source).render([Message("user", "hi")])
    assert time.monotonic() - started < 10


def test_bounds_leave_real_templates_alone(close_draft):
    """Numbers, widths and loops of ordinary size render as before; a template that would hang at
    load falls back to ChatML, logged."""
    template = ChatTemplate("{{ 12345678901 }} {{ 5000000|string }} {{ '%5d'|format(3) }} {{ '{:>4}'.format(1) }}"
                            "{% for i in range(1000) %}{% endfor %}{{ 'ab' * 3 }}")
    assert template.render([]) == "12345678901 5000000     3    1ababab"
    assert template_for("{{ 'x' * 10**20 }}", "", "").is_fallback
