"""A chat template that can render tool calls, as TRL's tool loop requires, for the course's models.

Serves notebook 07.

``GRPOTrainer(tools=...)`` refuses a template that cannot render a whole tool conversation (user, an assistant
turn with ``tool_calls``, the tool's reply): ``trl.chat_template_utils.supports_tool_calling``. Qwen2.5's and
Qwen3's own templates can; SmolLM2's cannot (it writes ``content`` only) and Gemma 3's raises on a ``tool``
message. TRL must also *parse* the model's calls: it recognises the templates it ships by their text and sets
the matching parser (``add_response_schema``); for any other template, TRL's documented way is to set the parser
on the tokenizer yourself (``tokenizer.response_template``), and the trainer then keeps it.

SmolLM2 is a ChatML model, with the same ``<|im_start|>``/``<|im_end|>`` turn tokens as Qwen, so two templates fit it:

- ``"qwen2.5"``: TRL's own copy of Qwen2.5's template (``trl.chat_template_utils.qwen2_5_chat_template``), which TRL
  recognises and parses with no help; its tool preamble makes every prompt about 280 tokens long;
- ``"compact"`` (:data:`COMPACT_TOOL_TEMPLATE`, the CPU default): the same turns and the same call format
  (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, so TRL's Qwen parser ``qwen3_template`` reads them)
  with the tools listed in one line each: prompts of about 70 tokens, and every training step that much cheaper
  on a CPU. It carries ``{% generation %}`` markers, so ``SFTTrainer(assistant_only_loss=True)`` masks the tools'
  replies in the warm-up too.

Example (a tool conversation, as TRL's loop builds one):
    >>> [m["role"] for m in example_tool_conversation()]
    ['system', 'user', 'assistant', 'tool', 'assistant']
"""

from __future__ import annotations

from typing import Any

CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")
TEMPLATES = ("compact", "qwen2.5")

#: ChatML with tool calls in Qwen2.5's format and a one-line-per-tool list (see the module's docstring).
COMPACT_TOOL_TEMPLATE = r"""
{%- if messages and messages[0].role == 'system' %}
    {%- set system, rest = messages[0].content, messages[1:] %}
{%- else %}
    {%- set system, rest = '', messages %}
{%- endif %}
{%- if system or tools %}
    {{- '<|im_start|>system\n' + system }}
    {%- if tools %}
        {{- ('\n' if system else '') + 'Tools:' }}
        {%- for tool in tools %}
            {%- set f = tool.function if tool.function is defined else tool %}
            {{- '\n- ' + f.name + '(' + (f.parameters.properties | list | join(', ')) + '): ' + f.description }}
        {%- endfor %}
        {{- '\nCall a tool with <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>' }}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in rest %}
    {%- if message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
            {{- message.content or '' }}
            {%- for call in message.tool_calls or [] %}
                {%- set f = call.function if call.function is defined else call %}
                {{- ('\n' if (message.content or not loop.first) else '') + '<tool_call>\n{"name": "' + f.name }}
                {{- '", "arguments": ' + (f.arguments | tojson) + '}\n</tool_call>' }}
            {%- endfor %}
            {{- '<|im_end|>\n' }}
        {%- endgeneration %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + (message.content | string) + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def example_tool_conversation(expression: str = "12 * 34", result: str = "408") -> list[dict]:
    """A full tool conversation (user, a call, the tool's reply, the answer) to render and test a template with."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
    return [{"role": "system", "content": "Use the calculator for arithmetic."},
            {"role": "user", "content": f"What is {expression}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": result},
            {"role": "assistant", "content": result}]


def needs_tool_template(tokenizer: Any) -> bool:
    """True when ``tokenizer``'s own chat template cannot render a tool conversation (TRL's own check)."""
    from trl.chat_template_utils import supports_tool_calling
    return not supports_tool_calling(tokenizer)


def is_chatml(tokenizer: Any) -> bool:
    """Whether the tokenizer has ChatML's turn tokens (``<|im_start|>``, ``<|im_end|>``) as single tokens."""
    vocab = tokenizer.get_vocab()
    return all(token in vocab for token in CHATML_TOKENS)


def use_tool_template(tokenizer: Any, template: str = "compact") -> Any:
    """Give ``tokenizer`` a template TRL can train tools with; returns it (unchanged when its own one can).

    A ChatML tokenizer whose template cannot render tool calls gets :data:`COMPACT_TOOL_TEMPLATE` with TRL's
    Qwen parser (``template="compact"``), or TRL's copy of Qwen2.5's template (``"qwen2.5"``, which TRL parses by
    itself). A template that renders tools already is kept, with a parser (:func:`with_parser`). Any other
    tokenizer raises a ``ValueError`` saying what to do."""
    if template not in TEMPLATES:
        raise ValueError(f"template={template!r}: use one of {TEMPLATES}.")
    if not needs_tool_template(tokenizer):
        return with_parser(tokenizer)
    if not is_chatml(tokenizer):
        raise ValueError(
            "This tokenizer's chat template cannot render tool calls (TRL's supports_tool_calling says False; Gemma "
            "3's raises on a 'tool' message) and it is not a ChatML tokenizer, so the course's templates would not "
            "fit its tokens. Use a model whose template renders tools (Qwen2.5 or Qwen3: "
            "get_profile(model='qwen2.5-1.5b')), or set tokenizer.chat_template to one that does and set "
            "tokenizer.response_template to parse its calls (transformers' response-parsing docs).")
    from trl.chat_template_utils import qwen2_5_chat_template, qwen3_template
    if template == "qwen2.5":
        tokenizer.chat_template = qwen2_5_chat_template  # GRPOTrainer's add_response_schema recognises it
    else:
        tokenizer.chat_template = COMPACT_TOOL_TEMPLATE
        tokenizer.response_template = qwen3_template  # TRL's parser of <tool_call>{json}</tool_call> turns
    return tokenizer


QWEN_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'


def with_parser(tokenizer: Any) -> Any:
    """``tokenizer`` with a parser for its calls: TRL's for a template it ships (``add_response_schema``, what
    ``GRPOTrainer`` does at init), else TRL's Qwen parser when the template writes Qwen's call format (a Qwen
    template that a library or a checkpoint edited, so TRL no longer recognises its text)."""
    if getattr(tokenizer, "response_template", None) is not None or getattr(tokenizer, "response_schema", None):
        return tokenizer
    from trl.chat_template_utils import add_response_schema, qwen3_template
    try:
        return add_response_schema(tokenizer)
    except ValueError:
        if QWEN_CALL not in tokenizer.apply_chat_template(example_tool_conversation(), tokenize=False):
            raise ValueError("TRL does not know how to read this template's tool calls: set "
                             "tokenizer.response_template to a parser for them (transformers' response-parsing "
                             "docs; trl.chat_template_utils has TRL's own for the templates it ships).") from None
        tokenizer.response_template = qwen3_template
        return tokenizer
