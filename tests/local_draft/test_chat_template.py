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
