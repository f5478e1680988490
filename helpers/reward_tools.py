"""Tools for looking at rewards: test cases, score tables, GRPO advantages.

- :class:`RewardCase` + :func:`check_cases`: write hand-made completions with
  the score you expect from each reward, get a pass/fail table
  (:func:`assert_cases` raises with that table; the course's unit tests use it).
- :func:`score_table`: every reward's score for a list of completions, plus
  the weighted total that TRL logs as ``reward``.
- :func:`group_advantages`: the group-relative advantages TRL 1.13's
  ``GRPOTrainer`` computes from those totals, and the fraction of groups whose
  rewards are all equal (``frac_reward_zero_std``: those teach nothing).

Example:
    >>> from helpers.rewards import correctness_reward, strict_format_reward
    >>> from helpers.reward_tools import RewardCase, check_cases
    >>> cases = [RewardCase("<reasoning>\\n1+1=2\\n</reasoning>\\n<answer>\\n2\\n</answer>",
    ...                     {"correctness_reward": 2.0, "strict_format_reward": 1.0}, answer="2")]
    >>> bool(check_cases(cases, [correctness_reward, strict_format_reward])["passed"].all())
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from .rewards import RewardFunc, completion_text, correctness_reward, get_preset  # noqa: F401 (doc examples)

__all__ = [
    "RewardCase", "check_cases", "assert_cases", "reward_name", "normalize_rewards",
    "score_table", "GroupAdvantages", "group_advantages", "nanstd", "plot_reward_distributions",
    "show_figure", "reward_playground",
]


def reward_name(func: Any) -> str:
    """The name TRL logs a reward under (``rewards/<name>/mean``).

    Example:
        >>> from helpers.rewards import xmlcount_reward
        >>> reward_name(xmlcount_reward)
        'xmlcount_reward'
    """
    return getattr(func, "__name__", None) or type(func).__name__


def normalize_rewards(rewards: Any) -> list[tuple[str, RewardFunc, float]]:
    """``[(name, func, weight)]`` from a function, a list of functions, a list of
    ``(func, weight)`` pairs (a preset) or a ``{name: func}`` dict.

    Example:
        >>> from helpers.rewards import get_preset
        >>> [(n, w) for n, _, w in normalize_rewards(get_preset("format-only"))][:1]
        [('prefilled_strict_format_reward', 1.0)]
    """
    if callable(rewards):
        rewards = [rewards]
    out: list[tuple[str, RewardFunc, float]] = []
    if isinstance(rewards, Mapping):
        for name, f in rewards.items():
            if isinstance(f, tuple):
                out.append((str(name), f[0], float(f[1])))
            else:
                out.append((str(name), f, 1.0))
        return out
    for item in rewards:
        if isinstance(item, tuple):
            f, w = item
            out.append((reward_name(f), f, float(w)))
        elif callable(item):
            out.append((reward_name(item), item, 1.0))
        else:
            raise TypeError(
                f"Expected a reward function or a (function, weight) pair, got {type(item).__name__}: "
                f"{item!r}. Pass e.g. [correctness_reward] or get_preset('arithmetic')."
            )
    names = [n for n, _, _ in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(
            f"Two rewards share the name(s) {dupes}; TRL logs rewards by name, so give each a "
            "distinct name (pass a dict {name: func}, or name= to the factory)."
        )
    return out


# --------------------------------------------------------------------------- test harness


@dataclass
class RewardCase:
    """One hand-written completion and the score each named reward should give it.

    ``expected`` maps reward names to a float, or ``None`` for "not applicable".
    ``answer``/``prompt``/``completion_ids``/``columns`` are what the trainer
    would pass alongside the completion.

    Example:
        >>> RewardCase("<answer>7</answer>", {"numeric_answer_reward": 0.5}, note="bare answer").note
        'bare answer'
    """

    completion: Any
    expected: dict[str, float | None]
    answer: Any = None
    prompt: Any = None
    completion_ids: list[int] | None = None
    note: str = ""
    columns: dict[str, Any] = field(default_factory=dict)


def _short(text: str, width: int = 48) -> str:
    one = text.replace("\n", "\\n")
    return one if len(one) <= width else one[: width - 3] + "..."


def _same(got: Any, want: Any, tol: float) -> bool:
    if want is None or got is None:
        return want is None and got is None
    try:
        if math.isnan(float(want)):
            return math.isnan(float(got))
        return abs(float(got) - float(want)) <= tol
    except (TypeError, ValueError):
        return False


def check_cases(cases: Sequence[RewardCase], rewards: Any, tol: float = 1e-6) -> Any:
    """Run every case through every reward it names; one row per (case, reward).

    Columns: ``case`` (index), ``note``, ``completion`` (shortened),
    ``reward``, ``expected``, ``got``, ``passed``. A case that names a reward
    not in ``rewards`` fails with ``got="missing"``, so a typo cannot pass.

    Example:
        >>> from helpers.rewards import numeric_answer_reward
        >>> t = check_cases([RewardCase("<answer>x</answer>", {"numeric_answer_reward": 0.5})],
        ...                 [numeric_answer_reward])
        >>> t[["got", "passed"]].values.tolist()
        [[0.0, False]]
    """
    import pandas as pd

    funcs = {name: f for name, f, _ in normalize_rewards(rewards)}
    rows = []
    for i, case in enumerate(cases):
        for name, want in case.expected.items():
            f = funcs.get(name)
            if f is None:
                got: Any = "missing"
            else:
                cols = {k: [v] for k, v in case.columns.items()}
                if case.answer is not None:
                    cols["answer"] = [case.answer]
                try:
                    got = f(
                        prompts=[case.prompt],
                        completions=[case.completion],
                        completion_ids=[case.completion_ids] if case.completion_ids is not None else None,
                        **cols,
                    )[0]
                except Exception as exc:  # a reward that raises fails its case, visibly
                    got = f"raised {type(exc).__name__}: {exc}"
            rows.append(
                dict(
                    case=i,
                    note=case.note,
                    completion=_short(completion_text(case.completion)),
                    reward=name,
                    expected=want,
                    got=got,
                    passed=(not isinstance(got, str)) and _same(got, want, tol),
                )
            )
    return pd.DataFrame(rows, columns=["case", "note", "completion", "reward", "expected", "got", "passed"])


def assert_cases(cases: Sequence[RewardCase], rewards: Any, tol: float = 1e-6) -> Any:
    """:func:`check_cases`, raising ``AssertionError`` listing every failing row.

    Example:
        >>> from helpers.rewards import numeric_answer_reward
        >>> _ = assert_cases([RewardCase("<answer>7</answer>", {"numeric_answer_reward": 0.5})],
        ...                  [numeric_answer_reward])
    """
    table = check_cases(cases, rewards, tol)
    failed = table[~table["passed"]]
    if len(failed):
        raise AssertionError(
            f"{len(failed)} of {len(table)} reward checks failed:\n"
            + failed.to_string(index=False, max_colwidth=60)
        )
    return table


# --------------------------------------------------------------------------- score table


def score_table(
    completions: Sequence[Any],
    rewards: Any,
    prompts: Sequence[Any] | None = None,
    completion_ids: Sequence[Sequence[int]] | None = None,
    show_columns: bool = True,
    width: int | None = 60,
    **columns: Sequence[Any],
) -> Any:
    """A DataFrame: one row per completion, one column per reward, and ``total``.

    ``columns`` are dataset columns (``answer=[...]``) passed to every reward
    exactly as TRL does. ``total`` is the weighted sum TRL logs as ``reward``
    (``None`` scores are skipped, like TRL's ``nansum``; NaN only when every
    reward returned ``None``). ``width`` shortens the completion column (None:
    full text).

    Example:
        >>> from helpers.rewards import correctness_reward, numeric_answer_reward
        >>> t = score_table(["<answer>4</answer>", "<answer>5</answer>"],
        ...                 [(correctness_reward, 1.0), (numeric_answer_reward, 0.5)], answer=["4", "4"])
        >>> t["total"].tolist()
        [2.25, 0.25]
    """
    import pandas as pd

    comps = list(completions)
    n = len(comps)
    for key, values in columns.items():
        if len(values) != n:
            raise ValueError(
                f"Column {key!r} has {len(values)} values but there are {n} completions; "
                "pass one value per completion (repeat a prompt's answer for each of its completions)."
            )
    specs = normalize_rewards(rewards)
    kwargs = {k: list(v) for k, v in columns.items()}
    data: dict[str, Any] = {}
    texts = [completion_text(c) for c in comps]
    data["completion"] = [_short(t, width) if width else t for t in texts]
    if show_columns:
        for k, v in kwargs.items():
            data[k] = v
    total = [0.0] * n
    seen = [False] * n
    for name, f, w in specs:
        try:
            scores = f(
                prompts=list(prompts) if prompts is not None else None,
                completions=comps,
                completion_ids=[list(x) for x in completion_ids] if completion_ids is not None else None,
                **kwargs,
            )
        except Exception as exc:
            raise RuntimeError(
                f"Reward {name!r} raised {type(exc).__name__}: {exc}. A reward must never raise; "
                "wrap its scorer with helpers.rewards.make_reward to turn errors into 0.0."
            ) from exc
        if len(scores) != n:
            raise ValueError(f"Reward {name!r} returned {len(scores)} scores for {n} completions.")
        col = []
        for i, s in enumerate(scores):
            v = float("nan") if s is None else float(s)
            col.append(v)
            if not math.isnan(v):
                total[i] += w * v
                seen[i] = True
        data[name] = col
    data["total"] = [t if s else float("nan") for t, s in zip(total, seen)]
    return pd.DataFrame(data)


# --------------------------------------------------------------------------- advantages


def nanstd(tensor: Any, dim: int | None = None) -> Any:
    """Bessel-corrected std ignoring NaNs; the formula of ``trl.trainer.utils.nanstd``.

    Kept here because importing ``trl.trainer`` pulls in all of transformers
    (~15 s); ``tests/test_reward_tools.py`` checks both agree.

    Example:
        >>> import torch
        >>> round(nanstd(torch.tensor([1.0, float("nan"), 3.0])).item(), 4)
        1.4142
    """
    import torch

    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    std = torch.sqrt(variance * correction)
    return std.squeeze(dim) if dim is not None else std.squeeze()


@dataclass
class GroupAdvantages:
    """What :func:`group_advantages` returns: per-completion lists (``rewards``,
    ``advantages``, ``std_used`` = the std each advantage was divided by,
    ``zero_std``) and per-group ones (``group_mean``, ``group_std``)."""

    rewards: list[float]
    advantages: list[float]
    group_mean: list[float]
    group_std: list[float]
    std_used: list[float]
    zero_std: list[bool]
    frac_zero_std: float
    group_size: int
    scale: str

    def to_frame(self) -> Any:
        """One row per completion: group, reward, group mean/std, advantage."""
        import pandas as pd

        g = self.group_size
        return pd.DataFrame(
            dict(
                group=[i // g for i in range(len(self.rewards))],
                reward=self.rewards,
                group_mean=[self.group_mean[i // g] for i in range(len(self.rewards))],
                std_used=self.std_used,
                advantage=self.advantages,
            )
        )


def group_advantages(
    rewards: Iterable[Any],
    group_size: int,
    scale: str = "group",
    weights: Sequence[float] | None = None,
) -> GroupAdvantages:
    """Group-relative advantages exactly as TRL 1.13's GRPOTrainer computes them.

    ``rewards`` holds one total per completion, groups of ``group_size``
    consecutive completions sharing one prompt (TRL's order). Or pass a
    per-completion list of per-reward scores with ``weights`` (like
    ``rewards_per_func``), which TRL sums with ``nansum``. ``None``/NaN is
    "not applicable"; a completion with no score at all gets advantage 0.

    - ``scale="group"``: (r - group mean) / (group std + 1e-4) (TRL's default);
    - ``"batch"``: (r - group mean) / (std of the whole batch + 1e-4);
    - ``"none"``: r - group mean (Dr. GRPO: no std scaling).

    The std is Bessel-corrected (:func:`nanstd`, TRL's formula); ``frac_zero_std`` is the
    fraction of completions in groups whose std is 0: their advantages are all
    0, so they contribute no gradient.

    Example:
        >>> a = group_advantages([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0], group_size=4)
        >>> [round(x, 3) for x in a.advantages[:4]], a.advantages[4:], a.frac_zero_std
        ([1.5, -0.5, -0.5, -0.5], [0.0, 0.0, 0.0, 0.0], 0.5)
    """
    import torch

    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none' (TRL's scale_rewards), got {scale!r}.")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1 (TRL's num_generations), got {group_size}.")
    raw = list(rewards)

    def _f(x: Any) -> float:
        return float("nan") if x is None else float(x)

    if raw and isinstance(raw[0], (list, tuple)):
        per_func = torch.tensor([[_f(x) for x in row] for row in raw], dtype=torch.float32)
        w = torch.tensor(list(weights) if weights is not None else [1.0] * per_func.shape[1], dtype=torch.float32)
        if w.numel() != per_func.shape[1]:
            raise ValueError(f"{w.numel()} weights for {per_func.shape[1]} rewards per completion.")
        unscorable = torch.isnan(per_func).all(dim=1)
        totals = (per_func * w.unsqueeze(0)).nansum(dim=1)
        totals[unscorable] = torch.nan
    else:
        totals = torch.tensor([_f(x) for x in raw], dtype=torch.float32)
    n = totals.numel()
    if n % group_size:
        raise ValueError(
            f"{n} rewards do not split into groups of {group_size}: TRL needs num_generations to divide "
            "the generation batch. Pass all completions of every prompt, grouped consecutively."
        )
    grouped = totals.view(-1, group_size)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(group_size, dim=0)
    if scale in ("group", "none"):
        std = (
            nanstd(grouped, dim=1).repeat_interleave(group_size, dim=0)
            if group_size > 1
            else torch.zeros_like(totals)
        )
    else:
        std = nanstd(totals).expand_as(totals) if n > 1 else torch.zeros_like(totals)
    adv = totals - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    zero = torch.isclose(std, torch.zeros_like(std))
    adv = torch.nan_to_num(adv, nan=0.0)
    groups = n // group_size
    out = GroupAdvantages(
        rewards=totals.tolist(),
        advantages=adv.tolist(),
        group_mean=[mean[i * group_size].item() for i in range(groups)],
        group_std=[
            (nanstd(grouped[i]).item() if group_size > 1 else 0.0) for i in range(groups)
        ],
        std_used=std.tolist(),
        zero_std=zero.tolist(),
        frac_zero_std=float(zero.float().mean().item()) if n else 0.0,
        group_size=group_size,
        scale=scale,
    )
    return out


# --------------------------------------------------------------------------- plots and playground


def plot_reward_distributions(table: Any, columns: Sequence[str] | None = None, ax: Any = None,
                              title: str | None = None) -> Any:
    """One histogram per reward column of a :func:`score_table` (``None`` scores left out, counted).

    Returns the matplotlib Figure. Columns default to every numeric column but
    ``total`` is drawn too, last.

    Example:
        >>> fig = plot_reward_distributions(score_table(["a"], [correctness_reward], answer=["1"]))  # doctest: +SKIP
    """
    import matplotlib.pyplot as plt

    if columns is None:
        columns = [c for c in table.columns if c != "completion" and str(table[c].dtype).startswith("float")]
    columns = list(columns)
    n = len(columns)
    if ax is None:
        fig, axes = plt.subplots(1, n, figsize=(3.0 * n, 2.6), squeeze=False)
        axes = list(axes[0])
    else:
        axes, fig = [ax] * n, ax.figure
    for a, col in zip(axes, columns):
        values = table[col]
        ok = values.dropna()
        missing = int(values.isna().sum())
        lo, hi = (float(ok.min()), float(ok.max())) if len(ok) else (0.0, 1.0)
        pad = 0.05 * (hi - lo) if hi > lo else 0.5
        a.hist(ok, bins=21, range=(lo - pad, hi + pad),
               color="tab:orange" if col == "total" else "tab:blue", edgecolor="white")
        label = col.replace("_reward", "")
        a.set_title(label + (f"\n({missing} n/a)" if missing else ""), fontsize=9)
        a.set_xlabel("score", fontsize=8)
        a.tick_params(labelsize=8)
    axes[0].set_ylabel("completions", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def show_figure(fig: Any, path: Any = None) -> None:
    """Display a matplotlib figure as a PNG (any backend, also Agg/headless) and close it.

    With ``path`` the PNG is also saved there.

    Example:
        >>> show_figure(plot_reward_distributions(table), RUN / "figures" / "rewards.png")  # doctest: +SKIP
    """
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    if path is not None:
        from pathlib import Path

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(buf.getvalue())
    try:
        from IPython.display import Image, display

        display(Image(buf.getvalue()))
    except ImportError:  # plain Python: nothing to display on
        pass


def reward_playground(rewards: Any, text: str = "", answer: str | None = None, prompt: Any = None,
                      show_static: bool = True) -> Any:
    """A text box: type a completion, see every reward's score (and the total) update live.

    ``answer`` pre-fills the gold answer box; ``prompt`` (e.g. one with a
    prefilled ``<reasoning>``) is passed to the rewards. Headless (no widget
    frontend, e.g. CI or a static viewer) the score table of ``text`` is
    printed as well, so the cell always shows something.

    Example:
        >>> box = reward_playground(get_preset("arithmetic"), "<answer>4</answer>", answer="4")  # doctest: +SKIP
    """
    import ipywidgets as W

    def table_for(t: str, gold: str) -> Any:
        cols = {"answer": [gold]} if gold else {"answer": [None]}
        return score_table([t], rewards, prompts=[prompt], show_columns=False, **cols).drop(columns=["completion"])

    box = W.Textarea(value=text, placeholder="Type a completion...", layout=W.Layout(width="100%", height="140px"))
    gold = W.Text(value=answer or "", description="answer:")
    out = W.Output()

    def refresh(_: Any = None) -> None:
        out.clear_output(wait=True)
        with out:
            t = table_for(box.value, gold.value).T
            t.columns = ["score"]
            print(t.to_string(float_format=lambda v: f"{v:.3f}"))

    box.observe(refresh, names="value")
    gold.observe(refresh, names="value")
    refresh()
    if show_static:
        t = table_for(text, answer or "").T
        t.columns = ["score"]
        print("Scores for the starting text (the widget below updates as you type):")
        print(t.to_string(float_format=lambda v: f"{v:.3f}"))
    return W.VBox([gold, box, out])
