"""Chat with a model: one reply function, a small widget, and a headless transcript.

The chat keeps the conversation as a list of ``{"role", "content"}`` messages
and samples each reply with :func:`helpers.generation.generate`, so it uses the
same backends (transformers, or vLLM on a GPU profile) and settings as the
evaluation.

Example:
    >>> from helpers.chat import reply
    >>> history = [{"role": "user", "content": "What is 12 + 30?"}]
    >>> text = reply(model, tok, history)            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Sequence

from .prompts import SYSTEM_PROMPT


def start_conversation(system_prompt: str | None = SYSTEM_PROMPT, system_role: bool = True) -> list[dict[str, str]]:
    """A new conversation, with the course's system prompt when the model takes one.

    Example:
        >>> start_conversation()[0]["role"]
        'system'
        >>> start_conversation(system_role=False)
        []
    """
    if system_prompt and system_role:
        return [{"role": "system", "content": system_prompt}]
    return []


def reply(model: Any, tokenizer: Any, history: Sequence[dict[str, str]], settings: Any = None,
          adapter: Any = None) -> str:
    """The model's next message after ``history`` (which ends with a user message).

    Example:
        >>> reply(model, tok, [{"role": "user", "content": "2+2?"}])   # doctest: +SKIP
        '<reasoning>...'
    """
    from .generation import SamplingSettings, generate

    if not history or history[-1].get("role") != "user":
        raise ValueError("The conversation must end with a user message; append "
                         "{'role': 'user', 'content': ...} first.")
    settings = settings or SamplingSettings(max_new_tokens=96, temperature=0.0)
    return generate(model, tokenizer, [list(history)], settings, adapter=adapter)[0][0]


def reply_with_prefill(model: Any, tokenizer: Any, history: Sequence[dict[str, str]],
                       settings: Any = None, adapter: Any = None, prefill: str | None = None) -> str:
    """Like :func:`reply`, but the answer starts with ``prefill`` (e.g. ``profile.prefill``),
    as in training; the returned text includes it.

    Example:
        >>> reply_with_prefill(model, tok, history, prefill="<reasoning>\\n")   # doctest: +SKIP
        '<reasoning>\\n7 + 5 = 12\\n</reasoning>...'
    """
    if not prefill:
        return reply(model, tokenizer, history, settings, adapter=adapter)
    from .generation import SamplingSettings, generate

    if not history or history[-1].get("role") != "user":
        raise ValueError("The conversation must end with a user message; append "
                         "{'role': 'user', 'content': ...} first.")
    settings = settings or SamplingSettings(max_new_tokens=96, temperature=0.0)
    prompt = list(history) + [{"role": "assistant", "content": prefill}]
    return prefill + generate(model, tokenizer, [prompt], settings, adapter=adapter)[0][0]


def transcript(model: Any, tokenizer: Any, questions: Sequence[str], settings: Any = None,
               system_prompt: str | None = SYSTEM_PROMPT, system_role: bool = True,
               multi_turn: bool = False, adapter: Any = None,
               prefill: str | None = None) -> list[dict[str, str]]:
    """Ask ``questions`` in turn and return the conversation (headless chat).

    With ``multi_turn=False`` every question starts a fresh conversation (what
    the model was trained on); with True they share one history. ``adapter``
    is the LoRA folder on a vLLM GPU model (see :func:`helpers.generation.generate`);
    ``prefill`` starts every answer as training did (``profile.prefill``).

    Example:
        >>> for m in transcript(model, tok, ["What is 7 + 5?"]):     # doctest: +SKIP
        ...     print(m["role"], m["content"])
    """
    history = start_conversation(system_prompt, system_role)
    shown: list[dict[str, str]] = []
    for q in questions:
        if not multi_turn:
            history = start_conversation(system_prompt, system_role)
        history.append({"role": "user", "content": q})
        answer = reply_with_prefill(model, tokenizer, history, settings, adapter, prefill)
        history.append({"role": "assistant", "content": answer})
        shown += history[-2:]
    return shown


def format_transcript(messages: Sequence[dict[str, str]]) -> str:
    """Plain-text rendering of a conversation (system messages left out).

    Example:
        >>> print(format_transcript([{"role": "user", "content": "hi"},
        ...                          {"role": "assistant", "content": "hello"}]))
        you: hi
        model: hello
    """
    names = {"user": "you", "assistant": "model"}
    return "\n".join(f"{names.get(m['role'], m['role'])}: {m['content']}"
                     for m in messages if m["role"] != "system")


def chat_widget(model: Any, tokenizer: Any, settings: Any = None,
                system_prompt: str | None = SYSTEM_PROMPT, system_role: bool = True,
                adapter: Any = None, prefill: str | None = None) -> Any:
    """A small ipywidgets chat: a text box, Send and Reset buttons, the transcript.

    Headless (no widget frontend), use :func:`transcript` instead; the
    notebook does both.

    Example:
        >>> chat_widget(model, tok)         # doctest: +SKIP
    """
    import html

    import ipywidgets as widgets

    history = start_conversation(system_prompt, system_role)
    box = widgets.Text(placeholder="Ask a question, e.g. What is 23 + 19?",
                       layout=widgets.Layout(width="70%"))
    send = widgets.Button(description="Send", button_style="primary")
    reset = widgets.Button(description="Reset")
    view = widgets.HTML()

    def draw() -> None:
        view.value = "".join(
            f"<p><b>{'you' if m['role'] == 'user' else 'model'}:</b> "
            f"<span style='white-space:pre-wrap'>{html.escape(m['content'])}</span></p>"
            for m in history if m["role"] != "system"
        )

    def on_send(*_: Any) -> None:
        text = box.value.strip()
        if not text:
            return
        box.value = ""
        history.append({"role": "user", "content": text})
        draw()
        history.append({"role": "assistant", "content": reply_with_prefill(
            model, tokenizer, history, settings, adapter, prefill)})
        draw()

    def on_reset(*_: Any) -> None:
        history[:] = start_conversation(system_prompt, system_role)
        draw()

    send.on_click(on_send)
    reset.on_click(on_reset)
    draw()
    return widgets.VBox([widgets.HBox([box, send, reset]), view])
