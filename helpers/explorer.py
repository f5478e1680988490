"""Completions explorer: read a run's ``completions.jsonl`` step by step.

Pick a prompt, move across the training steps where it was sampled, and see
every completion with each reward's score, beside the best completion of the
run's latest step. :func:`explorer` builds an ipywidgets view;
:func:`render_html` is the same view as static HTML (used when no widget
frontend is there, e.g. headless runs and GitHub's notebook viewer).

Each line of ``completions.jsonl`` (written by ``helpers.training``) is::

    {"step": 3, "prompt": "What is 12 + 30?", "completion": "...", "answer": "42",
     "rewards": {"correctness_reward": 2.0, ...}, "reward": 2.5, "advantage": 0.7}

Example:
    >>> from helpers.explorer import load_completions, step_summary
    >>> df = load_completions("tests/fixtures/run/completions.jsonl")   # doctest: +SKIP
    >>> step_summary(df)[["step", "reward"]]                            # doctest: +SKIP
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

#: Column prefix of the per-reward scores in the DataFrame.
REWARD_PREFIX = "reward/"


def load_completions(path: str | Path) -> Any:
    """``completions.jsonl`` as a pandas DataFrame, one row per completion.

    Columns: ``step, prompt, completion, answer, reward, advantage`` and one
    ``reward/<name>`` column per reward function. A line that is not valid
    JSON or lacks ``step``/``prompt``/``completion`` is skipped and counted in
    ``df.attrs["skipped"]`` (with the first bad line numbers in
    ``df.attrs["skipped_lines"]``).

    Example:
        >>> df = load_completions(RUN / "completions.jsonl")     # doctest: +SKIP
        >>> df.attrs["skipped"]                                  # doctest: +SKIP
        0
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"No completions log at {path}. Notebook 03 writes it while training "
            "(helpers.training.ensure_adapter(PROFILE, RUN) trains briefly if it is missing)."
        )
    records, bad = [], []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            rec = {
                "step": int(obj["step"]),
                "prompt": str(obj["prompt"]),
                "completion": _text(obj["completion"]),
                "answer": obj.get("answer"),
                "reward": _float(obj.get("reward")),
                "advantage": _float(obj.get("advantage")),
            }
        except (ValueError, KeyError, TypeError):
            bad.append(lineno)
            continue
        for name, value in (obj.get("rewards") or {}).items():
            rec[REWARD_PREFIX + name] = _float(value)
        records.append(rec)
    df = pd.DataFrame.from_records(records, columns=None if records else
                                   ["step", "prompt", "completion", "answer", "reward", "advantage"])
    df.attrs["skipped"] = len(bad)
    df.attrs["skipped_lines"] = bad[:10]
    df.attrs["path"] = str(path)
    return df


def _text(completion: Any) -> str:
    """A completion as text: plain strings as they are, conversational lists joined."""
    if isinstance(completion, str):
        return completion
    from .rewards import completion_text

    return completion_text(completion)


def _float(value: Any) -> float | None:
    if value is None:
        return None
    return float(value)


def reward_columns(df: Any) -> list[str]:
    """The ``reward/<name>`` columns of a completions DataFrame."""
    return [c for c in df.columns if c.startswith(REWARD_PREFIX)]


def prompts_by_steps(df: Any) -> Any:
    """Prompts with the steps they were sampled at, most-sampled first.

    Example:
        >>> prompts_by_steps(df).iloc[0]["n_steps"]       # doctest: +SKIP
        3
    """
    g = df.groupby("prompt", sort=False)["step"]
    out = g.agg(first_step="min", last_step="max", n_steps="nunique").reset_index()
    return out.sort_values(["n_steps", "first_step"], ascending=[False, True],
                           kind="stable").reset_index(drop=True)


def completions_at(df: Any, prompt: str, step: int) -> Any:
    """Completions of ``prompt`` at ``step``, best reward first."""
    sel = df[(df["prompt"] == prompt) & (df["step"] == int(step))]
    return sel.sort_values("reward", ascending=False, kind="stable", na_position="last")


def best_of_step(df: Any, step: int | None = None) -> Any:
    """The highest-reward completion of ``step`` (the latest step when None), as a row."""
    if df.empty:
        raise ValueError("The completions log is empty: nothing to show yet.")
    step = int(df["step"].max()) if step is None else int(step)
    sel = df[df["step"] == step]
    if sel.empty:
        raise ValueError(f"No completions logged at step {step}; steps present: "
                         f"{sorted(df['step'].unique().tolist())}.")
    return sel.sort_values("reward", ascending=False, kind="stable",
                           na_position="last").iloc[0]


def step_summary(df: Any) -> Any:
    """Per step: mean total reward, each reward's mean, completion length (words), count.

    Example:
        >>> step_summary(df).columns.tolist()[:3]         # doctest: +SKIP
        ['step', 'n', 'reward']
    """
    work = df.assign(words=df["completion"].str.split().str.len())
    agg: dict[str, Any] = {"n": ("completion", "size"), "reward": ("reward", "mean")}
    for col in reward_columns(df):
        agg[col] = (col, "mean")
    agg["words"] = ("words", "mean")
    return work.groupby("step").agg(**agg).reset_index()


def early_vs_late(df: Any, n_steps: int = 1, max_chars: int = 200) -> Any:
    """Early vs late on fixed prompts: for prompts sampled at several steps, their best
    completion at the first step and at the last. When no prompt repeats, the first
    ``n_steps`` steps are compared with the last ``n_steps`` (by mean reward and the
    best completion of each).

    Example:
        >>> early_vs_late(df)                        # doctest: +SKIP
    """
    import pandas as pd

    if df.empty:
        return pd.DataFrame()
    repeated = prompts_by_steps(df)
    repeated = repeated[repeated["n_steps"] > 1]
    records = []
    if not repeated.empty:
        for _, row in repeated.iterrows():
            early = completions_at(df, row["prompt"], row["first_step"])
            late = completions_at(df, row["prompt"], row["last_step"])
            records.append({
                "prompt": _clip(row["prompt"], max_chars),
                "early step": int(row["first_step"]),
                "early mean reward": round(float(early["reward"].mean()), 3),
                "early best": _clip(early.iloc[0]["completion"], max_chars),
                "late step": int(row["last_step"]),
                "late mean reward": round(float(late["reward"].mean()), 3),
                "late best": _clip(late.iloc[0]["completion"], max_chars),
            })
        return pd.DataFrame.from_records(records)
    steps = sorted(df["step"].unique().tolist())
    early_steps, late_steps = steps[:n_steps], steps[-n_steps:]
    for label, chosen in (("early", early_steps), ("late", late_steps)):
        sel = df[df["step"].isin(chosen)]
        best = sel.sort_values("reward", ascending=False, kind="stable").iloc[0]
        records.append({
            "when": label, "steps": f"{chosen[0]}-{chosen[-1]}",
            "mean reward": round(float(sel["reward"].mean()), 3),
            "best prompt": _clip(best["prompt"], max_chars),
            "best completion": _clip(best["completion"], max_chars),
        })
    return pd.DataFrame.from_records(records)


def _clip(text: str, n: int) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _completion_card(row: Any, reward_cols: list[str], title: str = "") -> str:
    scores = " ".join(
        f"<span style='margin-right:8px'><b>{html.escape(c[len(REWARD_PREFIX):])}</b>="
        f"{_fmt(row[c])}</span>" for c in reward_cols
    )
    head = f"<div style='font-size:90%;color:#555'>{html.escape(title)}</div>" if title else ""
    return (
        "<div style='border:1px solid #ccc;border-radius:4px;padding:6px;margin:4px 0'>"
        f"{head}<div style='font-size:90%'>total <b>{_fmt(row['reward'])}</b>"
        f" &middot; advantage {_fmt(row.get('advantage'))} &middot; {scores}</div>"
        f"<pre style='white-space:pre-wrap;margin:4px 0'>{html.escape(str(row['completion']))}</pre>"
        "</div>"
    )


def _plain(value: Any) -> str:
    return _fmt(value).replace("&ndash;", "-")


def _fmt(value: Any) -> str:
    try:
        if value is None or value != value:  # None or NaN
            return "&ndash;"
        return f"{float(value):.2f}"
    except (TypeError, ValueError):
        return html.escape(str(value))


def render_html(df: Any, prompt: str | None = None, step: int | None = None,
                max_completions: int = 8) -> str:
    """Static HTML: ``prompt`` at ``step`` (all completions, best first) beside the best
    completion of the latest step. Defaults: the most-sampled prompt, its last step.

    Example:
        >>> from IPython.display import HTML; HTML(render_html(df))   # doctest: +SKIP
    """
    if df.empty:
        return "<p>The completions log is empty: nothing to show yet.</p>"
    if prompt is None:
        prompt = prompts_by_steps(df).iloc[0]["prompt"]
    steps = sorted(df.loc[df["prompt"] == prompt, "step"].unique().tolist())
    if not steps:
        raise ValueError(f"Prompt not in the log: {prompt[:80]!r}.")
    step = steps[-1] if step is None else int(step)
    cols = reward_columns(df)
    rows = completions_at(df, prompt, step)
    answer = rows.iloc[0]["answer"] if not rows.empty else None
    left = "".join(_completion_card(r, cols, f"completion {i + 1}")
                   for i, (_, r) in enumerate(rows.head(max_completions).iterrows()))
    if rows.empty:
        left = f"<p>Not sampled at step {step}; its steps: {steps}.</p>"
    latest = best_of_step(df)
    right = _completion_card(latest, cols, f"prompt: {_clip(latest['prompt'], 120)}")
    return (
        f"<div><p><b>Prompt</b> (steps {steps}): {html.escape(prompt)}<br>"
        f"<b>Gold answer</b>: {html.escape(str(answer))}</p>"
        "<div style='display:flex;gap:12px'>"
        f"<div style='flex:1'><h4>Step {step}: {len(rows)} completions, best first</h4>{left}</div>"
        f"<div style='flex:1'><h4>Best of the latest step ({int(df['step'].max())})</h4>"
        f"{right}</div></div></div>"
    )


def render_text(df: Any, prompt: str | None = None, step: int | None = None,
                max_chars: int = 120) -> str:
    """The same view as plain text (for logs and terminals)."""
    if df.empty:
        return "The completions log is empty: nothing to show yet."
    if prompt is None:
        prompt = prompts_by_steps(df).iloc[0]["prompt"]
    steps = sorted(df.loc[df["prompt"] == prompt, "step"].unique().tolist())
    step = steps[-1] if step is None else int(step)
    cols = reward_columns(df)
    lines = [f"prompt (steps {steps}): {_clip(prompt, max_chars)}", f"step {step}:"]
    for _, r in completions_at(df, prompt, step).iterrows():
        scores = ", ".join(f"{c[len(REWARD_PREFIX):]}={r[c]:.2f}" for c in cols
                           if r[c] is not None and r[c] == r[c])
        text = _clip(str(r["completion"]).replace("\n", " \u21b5 "), max_chars)
        lines.append(f"  total={_plain(r['reward'])} [{scores}] {text}")
    latest = best_of_step(df)
    text = _clip(str(latest["completion"]).replace("\n", " \u21b5 "), max_chars)
    lines.append(f"best of the latest step ({int(df['step'].max())}): "
                 f"total={_plain(latest['reward'])} {text}")
    return "\n".join(lines)


def explorer(df: Any) -> Any:
    """An ipywidgets view: a prompt dropdown and a step slider, redrawn as HTML.

    Returns the widget (display it, or let the notebook show it as the cell's
    value). The static :func:`render_html` shows the same content without a
    widget frontend.

    Example:
        >>> explorer(load_completions(RUN / "completions.jsonl"))     # doctest: +SKIP
    """
    import ipywidgets as widgets

    if df.empty:
        return widgets.HTML(render_html(df))
    table = prompts_by_steps(df)
    options = [(f"[{r.n_steps} step{'s' if r.n_steps > 1 else ''}] {_clip(r.prompt, 70)}",
                r.prompt) for r in table.itertuples()]
    prompt_box = widgets.Dropdown(options=options, description="prompt",
                                  layout=widgets.Layout(width="95%"))
    step_slider = widgets.SelectionSlider(options=[0], description="step",
                                          continuous_update=False)
    view = widgets.HTML()

    def steps_of(prompt: str) -> list[int]:
        return sorted(df.loc[df["prompt"] == prompt, "step"].unique().tolist())

    updating = {"now": False}

    def redraw(*_: Any) -> None:
        if not updating["now"]:
            view.value = render_html(df, prompt_box.value, step_slider.value)

    def on_prompt(*_: Any) -> None:
        steps = steps_of(prompt_box.value)
        updating["now"] = True
        try:
            step_slider.options = steps
            step_slider.value = steps[-1]
        finally:
            updating["now"] = False
        redraw()

    prompt_box.observe(on_prompt, names="value")
    step_slider.observe(redraw, names="value")
    on_prompt()
    return widgets.VBox([prompt_box, step_slider, view])
