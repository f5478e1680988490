"""The course's response format, and prompts exactly as TRL renders them.

A completion the course rewards looks like::

    <reasoning>
    15 + 27 = 42
    </reasoning>
    <answer>
    42
    </answer>

A prompt is a conversation, system + user (the dataset's ``prompt`` column).
TRL 1.13's ``GRPOTrainer`` renders it with
``apply_chat_template(prompt, add_generation_prompt=True, **chat_template_kwargs)``
and never continues a final assistant message. So the course *prefills* the
opening tag in the template's generation prompt (:func:`install_prefill`):
every render (TRL's, ``SFTTrainer``'s, :func:`encode` for evaluation and chat)
then ends with ``<reasoning>\\n`` and gives the model the same tokens.

Example:
    >>> [m["role"] for m in build_prompt("What is 2 + 3?")]
    ['system', 'user']
    >>> print(reference_completion("2 + 3 = 5", "5"))
    <reasoning>
    2 + 3 = 5
    </reasoning>
    <answer>
    5
    </answer>
"""

from __future__ import annotations

import json
from typing import Any, Sequence

REASONING_START = "<reasoning>"
REASONING_END = "</reasoning>"
ANSWER_START = "<answer>"
ANSWER_END = "</answer>"

#: What the course prefills: the opening tag and a newline.
PREFILL = REASONING_START + "\n"

SYSTEM_PROMPT = (
    "Respond in the following format:\n"
    f"{REASONING_START}\n...\n{REASONING_END}\n"
    f"{ANSWER_START}\n...\n{ANSWER_END}"
)

#: Marks the block :func:`install_prefill` appends to a chat template.
_MARK = "{#- course prefill #}"


def build_prompt(question: str, system_prompt: str | None = SYSTEM_PROMPT,
                 system_role: bool = True) -> list[dict[str, str]]:
    """The conversational prompt for one question: system + user messages.

    ``system_role=False`` (templates that reject a system message, such as
    Gemma 2) folds the system prompt into the user message.

    Example:
        >>> build_prompt("2+2?", system_prompt="Be brief.", system_role=False)
        [{'role': 'user', 'content': 'Be brief.\\n\\n2+2?'}]
    """
    if not system_prompt:
        return [{"role": "user", "content": question}]
    if not system_role:
        return [{"role": "user", "content": f"{system_prompt}\n\n{question}"}]
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def reference_completion(solution: str, answer: str) -> str:
    """A completion in the course format (the warm-up's targets, test cases).

    Example:
        >>> reference_completion("1 + 1 = 2", "2").splitlines()[0]
        '<reasoning>'
    """
    return f"{REASONING_START}\n{solution}\n{REASONING_END}\n{ANSWER_START}\n{answer}\n{ANSWER_END}"


def _text_tokenizer(tokenizer: Any) -> Any:
    """A processor (Gemma 3 through Unsloth) wraps the text tokenizer."""
    return getattr(tokenizer, "tokenizer", tokenizer)


def install_prefill(tokenizer: Any, prefill: str | None = PREFILL) -> Any:
    """Make the chat template's generation prompt end with ``prefill``; return the tokenizer.

    Appends ``{% if add_generation_prompt %}<prefill>{% endif %}`` to the
    template, so a rendered prompt ends inside the assistant turn while a
    rendered conversation (prompt + an assistant answer that starts with the
    prefill, as ``SFTTrainer`` renders it) is unchanged. Idempotent: an earlier
    prefill is replaced; ``prefill=None`` or ``""`` removes it. Saved with the
    tokenizer (``save_pretrained``), so a reloaded adapter or merged model
    renders the same way.

    Example:
        tok = install_prefill(load_tokenizer(), "<reasoning>\\n")
        render(tok, build_prompt("2+2?"))[-24:]
        # -> '<|im_start|>assistant\\n<reasoning>\\n'
    """
    targets = {id(t): t for t in (tokenizer, _text_tokenizer(tokenizer))}.values()
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
    """The prefill :func:`install_prefill` put into the template ("" when none).

    Example:
        installed_prefill(install_prefill(tok, "<reasoning>\\n"))
        # -> '<reasoning>\\n'
    """
    template = next((t.chat_template for t in (tokenizer, _text_tokenizer(tokenizer))
                     if isinstance(getattr(t, "chat_template", None), str)), "")
    if _MARK not in template:
        return ""
    block = template.split(_MARK, 1)[1]
    return json.JSONDecoder().raw_decode(block[block.index("{{") + 2:].lstrip())[0]


def render(tokenizer: Any, prompt: Any, **chat_template_kwargs: Any) -> str:
    """The text the model sees for a prompt, rendered as TRL's ``GRPOTrainer`` renders it.

    A plain string is returned as it is (TRL applies no template to text prompts).

    Example:
        render(tok, build_prompt("What is 2 + 3?"))[-22:]
        # -> '<|im_start|>assistant\\n'
    """
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True,
                                         **chat_template_kwargs)


def encode(tokenizer: Any, prompts: Sequence[Any], **chat_template_kwargs: Any) -> list[list[int]]:
    """Token ids of each prompt, by the same call TRL 1.13 makes before generating.

    Conversations go through ``apply_chat_template(..., add_generation_prompt=True,
    tokenize=True)``; plain strings through ``tokenizer(text=...)``, as TRL does.

    Example:
        encode(tok, [build_prompt("What is 2 + 3?")])[0][:2]
        # -> [1, 9690]
    """
    prompts = list(prompts)
    if not prompts:
        return []
    if isinstance(prompts[0], str):
        return [list(x) for x in tokenizer(text=prompts)["input_ids"]]
    out = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True,
                                        return_dict=True, **chat_template_kwargs)
    return [list(x) for x in out["input_ids"]]


def supports_system_role(tokenizer: Any) -> bool:
    """Whether the chat template renders a system message (Gemma 2's raises; some drop it).

    Example:
        supports_system_role(tok)
        # -> True
    """
    probe = "SYSTEM-ROLE-PROBE-31"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": probe}, {"role": "user", "content": "hi"}],
            tokenize=False, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - jinja raises TemplateError, others ValueError
        return False
    return isinstance(text, str) and probe in text
