"""What the model wrote during training, read from TRL's ``log_completions`` parquet files (one per step): notebooks 03,
04 and 07.

A tool-calling run's completion is a conversation: TRL's ``completion`` column holds it decoded as one text (the
tools' replies included, the turn tokens dropped), and a reward may log the messages themselves with TRL's
``log_extra`` (``helpers.tasks.tool_arithmetic.tool_answer_reward`` logs them as the column ``turns``). Where that
column is present, :func:`render_step` shows each completion turn by turn (:func:`turns_html`).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from .rewards import clip


def load_completions(output_dir: str | Path, max_step: int | None = None) -> Any:
    """Every logged completion of ``RUN/grpo`` as one DataFrame, plus ``reward``, the weighted total TRL ranked."""
    import pandas as pd
    folder = Path(output_dir)
    folder = folder if folder.name == "completions" else folder / "completions"
    files = sorted(folder.glob("completions_*.parquet"))
    if not files:
        raise FileNotFoundError(f"No completion logs in {folder}. Train with GRPOConfig(log_completions=True) "
                                "(notebook 03 does), or helpers.training.ensure_adapter(PROFILE, RUN).")
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    if max_step is not None:  # later steps are left by a run resumed from an earlier checkpoint
        df = df[df["step"] <= max_step].reset_index(drop=True)
    try:
        config = json.loads((folder.parent.parent / "train_config.json").read_text())
        weights = {r["name"]: float(r["weight"]) for r in config["rewards"]}
    except (OSError, ValueError, KeyError, TypeError):
        weights = {}
    names = [n for n in weights if n in df.columns] or [c for c in df.columns if c.endswith("_reward")]
    # TRL's nansum: a reward that returned None is skipped; a row where every reward did has no total
    df["reward"] = df[names].mul([weights.get(n, 1.0) for n in names]).sum(axis=1, min_count=1)
    df.attrs["rewards"] = names
    return df


def reward_columns(df: Any) -> list[str]:
    """The per-reward columns of a completions DataFrame (TRL names them after the functions)."""
    return df.attrs.get("rewards") or [c for c in df.columns if c.endswith("_reward")]


def step_summary(df: Any) -> Any:
    """Per step: completions, mean total reward, each reward's mean, mean length in words."""
    words = df["completion"].str.split().str.len()
    table = df.assign(words=words).groupby("step").agg(
        completions=("completion", "size"), reward=("reward", "mean"),
        **{name: (name, "mean") for name in reward_columns(df)}, words=("words", "mean"))
    return table.reset_index()


def early_vs_late(df: Any, steps: int = 1, max_chars: int = 160) -> Any:
    """The first ``steps`` steps against the last ones: mean reward and the best completion of each."""
    import pandas as pd
    all_steps = sorted(df["step"].unique())
    rows = []
    for label, chosen in (("early", all_steps[:steps]), ("late", all_steps[-steps:])):
        part = df[df["step"].isin(chosen)]
        best = part.sort_values("reward", ascending=False, kind="stable").iloc[0]
        rows.append({"when": label, "steps": f"{chosen[0]}-{chosen[-1]}",
                     "mean reward": round(part["reward"].mean(), 3),
                     "best completion": clip(best["completion"], max_chars), "its reward": round(best["reward"], 3)})
    return pd.DataFrame(rows)


def render_step(df: Any, step: int | None = None, max_completions: int = 8) -> str:
    """Static HTML of one step (the latest when None): each prompt's completions, best first, with their scores."""
    if df.empty:
        return "<p>The completion log is empty: nothing to show yet.</p>"
    step = int(df["step"].max()) if step is None else int(step)
    part = df[df["step"] == step]
    names = reward_columns(df)
    blocks = [f"<h4>Step {step}: {len(part)} completions</h4>"]
    for prompt, group in part.groupby("prompt", sort=False):
        gold = f" &middot; gold answer <b>{html.escape(str(group['answer'].iloc[0]))}</b>" if "answer" in group else ""
        blocks.append(f"<p><b>Prompt</b> (its end): {html.escape(clip(prompt[-160:], 200))}{gold}</p>")
        for _, row in group.sort_values("reward", ascending=False).head(max_completions).iterrows():
            scores = " ".join(f"{html.escape(n.removesuffix('_reward'))}={_num(row[n])}" for n in names)
            blocks.append(
                "<div style='border:1px solid #ccc;border-radius:4px;padding:4px 6px;margin:3px 0'>"
                f"<small>total <b>{_num(row['reward'])}</b> &middot; advantage {_num(row['advantage'])} &middot; "
                f"{scores}</small>{_completion_html(row)}</div>")
    return "<div>" + "".join(blocks) + "</div>"


def _num(value: Any) -> str:
    return "&ndash;" if value is None or value != value else f"{float(value):.2f}"  # None or NaN: a dash


def _completion_html(row: Any) -> str:
    messages = turns_of(row) if "turns" in row.index else None
    if messages is not None:
        return turns_html(messages)
    return f"<pre style='white-space:pre-wrap;margin:2px 0'>{html.escape(str(row['completion']))}</pre>"


def turns_of(row: Any) -> list[dict] | None:
    """The messages of a logged completion from its ``turns`` column (JSON text), or ``None`` when not logged."""
    try:
        value = row["turns"]
        messages = json.loads(value) if isinstance(value, str) else None
    except (KeyError, TypeError, ValueError):
        return None
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else None


def _call_text(call: Any) -> str:
    function = call.get("function", call) if isinstance(call, dict) else {}
    arguments = function.get("arguments")
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items()) if isinstance(arguments, dict) else (
        "" if arguments is None else json.dumps(arguments))
    return f"{function.get('name')}({args})"


def format_turns(messages: Any) -> str:
    """A rollout's messages as text, one line a turn: the model's calls and answers, the tools' replies.

    Example:
        >>> print(format_turns([{"role": "assistant", "content": "", "tool_calls": [{"type": "function",
        ...     "function": {"name": "calculator", "arguments": {"expression": "2 * 3"}}}]},
        ...     {"role": "tool", "name": "calculator", "content": "6"}, {"role": "assistant", "content": "6"}]))
        model  calls calculator(expression="2 * 3")
        tool   6   (its reply: the loss masks it)
        model  6
    """
    lines = []
    for message in messages or []:
        role, content = message.get("role"), str(message.get("content") or "").strip()
        if role == "tool":
            lines.append(f"tool   {content}   (its reply: the loss masks it)")
            continue
        if content:
            lines.append("model  " + content.replace("\n", "\n       "))
        lines += [f"model  calls {_call_text(call)}" for call in message.get("tool_calls") or []]
    return "\n".join(lines)


def turns_html(messages: Any) -> str:
    """Static HTML of a rollout, turn by turn: the model's calls and answers, the tools' replies shaded (masked)."""
    blocks = []
    for message in messages or []:
        role, content = message.get("role"), str(message.get("content") or "")
        if role == "tool":
            blocks.append("<div style='background:#eee;color:#555;padding:1px 6px;margin:1px 0'><small>tool reply "
                          f"(masked from the loss)</small><pre style='white-space:pre-wrap;margin:0'>"
                          f"{html.escape(content)}</pre></div>")
            continue
        parts = ([f"<pre style='white-space:pre-wrap;margin:0'>{html.escape(content)}</pre>"] if content.strip()
                 else []) + [f"<pre style='white-space:pre-wrap;margin:0'>&#x1F527; {html.escape(_call_text(c))}</pre>"
                             for c in message.get("tool_calls") or []]
        blocks.append("<div style='padding:1px 6px;margin:1px 0'><small>model</small>" + "".join(parts) + "</div>")
    return "<div style='margin:2px 0'>" + "".join(blocks) + "</div>"
