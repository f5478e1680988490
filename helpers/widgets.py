"""ipywidgets for the notebooks (reward playground, completions explorer, chat box), as Colab's 7.7.1 renders them.

Serves notebooks 02, 04 and 07.
"""

from __future__ import annotations

import html
from typing import Any

from .explorer import render_step
from .generation import transcript
from .reward_lab import score_table


def reward_playground(rewards: Any, text: str = "", answer: str | None = None, **columns: Any) -> Any:
    """Type a completion, see each reward's score and the weighted total as you type (``columns``: ``schema=``)."""
    import ipywidgets as W
    box = W.Textarea(value=text, placeholder="Type a completion...", layout=W.Layout(width="auto", height="140px"))
    gold = W.Text(value=answer or "", description="answer:")
    out = W.HTML()

    def refresh(*_: Any) -> None:
        table = score_table([box.value], rewards, answer=[gold.value or None], **{k: [v] for k, v in columns.items()})
        text = table.drop(columns=["completion"]).T.to_string(header=False, float_format=lambda v: f"{v:.3f}")
        out.value = f"<pre style='line-height:1.3'>{html.escape(text)}</pre>"

    box.observe(refresh, names="value")
    gold.observe(refresh, names="value")
    refresh()
    return W.VBox([gold, box, out])


def completions_explorer(df: Any) -> Any:
    """A step slider over a run's completion log (:func:`helpers.explorer.load_completions`)."""
    import ipywidgets as W
    steps = sorted(int(s) for s in df["step"].unique()) or [0]
    slider = W.SelectionSlider(options=steps, value=steps[-1], description="step", continuous_update=False)
    view = W.HTML(render_step(df, steps[-1]))
    slider.observe(lambda change: setattr(view, "value", render_step(df, change["new"])), names="value")
    return W.VBox([slider, view])


def chat_box(model: Any, tokenizer: Any, settings: Any, system_prompt: str | None = None, adapter: Any = None,
             chat_template_kwargs: dict | None = None) -> Any:
    """A text box and a Send button; each question is a fresh conversation (what the model was trained on)."""
    import ipywidgets as W
    box = W.Text(placeholder="Ask a question, e.g. What is 23 + 19?", layout=W.Layout(width="70%"))
    send = W.Button(description="Send", button_style="primary")
    view = W.HTML()

    def on_send(*_: Any) -> None:
        question, box.value = box.value.strip(), ""
        if question:
            messages = transcript(model, tokenizer, [question], settings, system_prompt=system_prompt, adapter=adapter,
                                  chat_template_kwargs=chat_template_kwargs)
            view.value += "".join(f"<p><b>{'you' if m['role'] == 'user' else 'model'}:</b> <span style="
                                  f"'white-space:pre-wrap'>{html.escape(m['content'])}</span></p>" for m in messages)

    send.on_click(on_send)
    return W.VBox([W.HBox([box, send]), view])
