"""Prompts exactly as TRL renders them, a task's prefill inside the chat template's generation prompt.

Serves notebooks 01, 03, 04, 05, 07 and 08.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

#: Marks the block :func:`install_prefill` appends to a chat template.
_MARK = "{#- course prefill #}"


def build_prompt(question: str, system_prompt: str | None = None, system_role: bool = True) -> list[dict[str, str]]:
    """System + user messages; ``system_role=False`` folds the system prompt into the user turn."""
    if not system_prompt:
        return [{"role": "user", "content": question}]
    if not system_role:
        return [{"role": "user", "content": f"{system_prompt}\n\n{question}"}]
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def text_tokenizer(tokenizer: Any) -> Any:
    """The text tokenizer inside a processor (Gemma 3 through Unsloth), or the tokenizer itself."""
    return getattr(tokenizer, "tokenizer", tokenizer)


def install_prefill(tokenizer: Any, prefill: str | None) -> Any:
    """End the template's generation prompt with ``prefill`` (``None`` or ``""`` removes it); returns the tokenizer."""
    targets = {id(t): t for t in (tokenizer, text_tokenizer(tokenizer))}.values()
    templated = [t for t in targets if isinstance(getattr(t, "chat_template", None), str)]
    if not templated:
        raise ValueError("This tokenizer has no chat template (a base model?): the course's prompts are "
                         "conversations. Use an instruct model, or give the tokenizer a chat template.")
    for t in templated:
        base = t.chat_template.split(_MARK, 1)[0]
        if prefill:
            literal = json.dumps(prefill, ensure_ascii=False)
            base += f"{_MARK}{{% if add_generation_prompt %}}{{{{ {literal} }}}}{{% endif %}}"
        t.chat_template = base
    return tokenizer


def installed_prefill(tokenizer: Any) -> str:
    """The prefill :func:`install_prefill` put into the template (``""`` when none)."""
    template = next((t.chat_template for t in (tokenizer, text_tokenizer(tokenizer))
                     if isinstance(getattr(t, "chat_template", None), str)), "")
    if _MARK not in template:
        return ""
    block = template.split(_MARK, 1)[1]
    return json.JSONDecoder().raw_decode(block[block.index("{{") + 2:].lstrip())[0]


def render(tokenizer: Any, prompt: Any, **chat_template_kwargs: Any) -> str:
    """The text the model sees for a prompt, as TRL renders it (a plain string is used as it is)."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True,
                                         **chat_template_kwargs)


def encode(tokenizer: Any, prompts: Sequence[Any], **chat_template_kwargs: Any) -> list[list[int]]:
    """Token ids of each prompt, by the call TRL makes before generating (strings: ``tokenizer(text=...)``)."""
    prompts = list(prompts)
    if not prompts:
        return []
    if isinstance(prompts[0], str):
        return [list(x) for x in tokenizer(text=prompts)["input_ids"]]
    out = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True,
                                        **chat_template_kwargs)
    return [list(x) for x in out["input_ids"]]


def supports_system_role(tokenizer: Any) -> bool:
    """Whether the chat template renders a system message (Gemma 2's raises; some drop it)."""
    probe = "SYSTEM-ROLE-PROBE-31"
    try:
        text = tokenizer.apply_chat_template([{"role": "system", "content": probe}, {"role": "user", "content": "hi"}],
                                             tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja raises TemplateError, others ValueError
        return False
    return isinstance(text, str) and probe in text
