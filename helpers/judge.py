"""A model as the reward (notebook 08): an ``async def`` GRPO reward that asks a judge behind an OpenAI-compatible server.

:func:`judge_reward` builds it (``AsyncOpenAI``, timeout, retries, cache, bounded concurrency, ``None`` when the judge
cannot answer; it never raises); :func:`rubric_reward` gates on format, then weighs criteria, the judge one of them;
:func:`judge_warnings` and ``JudgeWatchCallback`` name a judge that stopped answering; :func:`stop_with_this_process`
stops a server when the kernel that started it dies.

Example:
    >>> parse_verdict("Yes, 42 is right."), parse_verdict(" NO."), parse_verdict("<|im_end|>"), parse_verdict(None)
    (1.0, 0.0, None, None)
    >>> round(cohen_kappa([True, True, False, False], [True, False, False, False]), 2)
    0.5
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .reward_logs import step_of, write_lines
from .rewards import completion_text, completion_texts
from .watch import RunWarning

#: What the judge is asked. ``{reference}`` is empty unless the reward is given the gold answer.
JUDGE_SYSTEM = "You check answers to arithmetic questions. Reply with one word: yes or no."
JUDGE_PROMPT = "Question: {question}\n{reference}Proposed answer:\n{completion}\n\nIs the proposed answer correct?"
YES, NO = ("yes", "correct", "right", "true"), ("no", "incorrect", "wrong", "false")
_WORD = re.compile(r"[a-z]+")
#: The metrics the reward logs each step through TRL's ``log_metric`` (``judge/...`` in trackio and the log history).
FAILED, UNPARSED, LATENCY, SECONDS = "judge/failed", "judge/unparsed", "judge/latency_s", "judge/seconds"
FIX = ("the judge's server did not answer (stopped, crashed, or slower than the timeout): its reward is None for "
       "those completions and TRL leaves them out, so only the other rewards teach. Start the server again on the "
       "same port (the reward reconnects by itself), or raise timeout=; a run on the judge alone learns nothing "
       "while it is down")


def parse_verdict(text: Any) -> float | None:
    """1.0 for a yes, 0.0 for a no (the first yes/no-like word of the judge's reply), else ``None``; never raises."""
    try:
        for word in _WORD.findall(str(text).lower())[:8] if text is not None else []:
            if word in YES:
                return 1.0
            if word in NO:
                return 0.0
    except Exception:  # noqa: BLE001 - whatever the judge wrote
        pass
    return None


def logprob_score(choice: Any) -> float | None:
    """P(yes) / (P(yes) + P(no)) over the first token's ``top_logprobs`` (None where neither is among them)."""
    try:
        p = {1.0: 0.0, 0.0: 0.0, None: 0.0}
        for top in choice.logprobs.content[0].top_logprobs:
            word = top.token.strip().lower()
            p[1.0 if word in YES else 0.0 if word in NO else None] += math.exp(top.logprob)
        return p[1.0] / (p[1.0] + p[0.0]) if p[1.0] + p[0.0] > 0 else None
    except Exception:  # noqa: BLE001
        return None


def question_of(prompt: Any) -> str:
    """The last user message of a conversational prompt, or the prompt text itself."""
    if isinstance(prompt, (list, tuple)):
        users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return completion_text(users[-1:] or list(prompt))
    return completion_text(prompt)


def judge_messages(question: str, completion: str, reference: str | None = None) -> list[dict[str, str]]:
    """The chat the judge gets for one completion."""
    ref = f"Reference answer: {reference}\n" if reference is not None else ""
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": JUDGE_PROMPT.format(question=question, reference=ref, completion=completion)}]


@dataclass
class JudgeStats:
    """Counts over the reward's life: requests sent, cache hits, failures (no answer), unparsed replies, latencies."""
    requests: int = 0; cache_hits: int = 0; failed: int = 0; unparsed: int = 0  # noqa: E702
    latencies: list[float] = field(default_factory=list); errors: list[str] = field(default_factory=list)  # noqa


def judge_reward(base_url: str, model: str = "judge", *, name: str = "judge_reward", with_reference: bool = False,
                 prefill: str = "", scoring: str = "logprob", timeout: float = 20.0, retries: int = 2,
                 backoff: float = 0.5, concurrency: int = 4, cache: bool = True, max_tokens: int = 1,
                 api_key: str = "local", log_dir: str | Path | None = None) -> Callable[..., Any]:
    """An ``async def`` reward in TRL's convention: each completion's score in [0, 1] by the judge at ``base_url``,
    ``None`` after ``retries`` failed tries (``backoff`` s, doubling) or an unreadable reply. ``scoring``: "logprob"
    (P(yes) on the first token) or "text" (the reply parsed); ``with_reference``: show the ``answer`` column;
    ``prefill``: put back before each completion. Logs ``judge/*`` metrics each step (TRL's ``log_metric``), the
    replies (``log_extra``) and, with ``log_dir``, a JSON line per completion; has ``.stats`` and ``.cache``."""
    if scoring not in ("logprob", "text"):
        raise ValueError(f"scoring={scoring!r}: use 'logprob' (P(yes) on the first token) or 'text' (the reply parsed).")
    stats, memo = JudgeStats(), {}

    async def ask(client: Any, gate: asyncio.Semaphore, messages: list[dict]) -> tuple[float | None, str, str]:
        key = json.dumps(messages)
        if cache and key in memo:
            stats.cache_hits += 1
            return memo[key]
        for attempt in range(max(0, retries) + 1):
            await asyncio.sleep(backoff * 2 ** (attempt - 1) if attempt else 0)
            try:
                async with gate:
                    start, stats.requests = time.perf_counter(), stats.requests + 1
                    extra = {"logprobs": True, "top_logprobs": 10} if scoring == "logprob" else {}
                    reply = await asyncio.wait_for(client.chat.completions.create(
                        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, **extra), timeout)
                    stats.latencies.append(time.perf_counter() - start)
                choice, text = reply.choices[0], reply.choices[0].message.content or ""
                score = logprob_score(choice) if scoring == "logprob" else None
                score = parse_verdict(text) if score is None else score
                stats.unparsed += score is None
                out = (score, text, "" if score is not None else "unparsed")
                memo.update({key: out} if cache else {})
                return out
            except Exception as exc:  # noqa: BLE001 - a reward never raises: every failure becomes None
                error = f"{type(exc).__name__}: {str(exc)[:120]}"
        stats.failed += 1
        stats.errors.append(error)
        return None, "", error

    async def reward(prompts: Sequence[Any] = (), completions: Sequence[Any] = (), answer: Sequence[Any] | None = None,
                     log_metric: Callable | None = None, log_extra: Callable | None = None,
                     trainer_state: Any = None, **kwargs: Any) -> list[float | None]:
        import openai
        start, texts = time.perf_counter(), [prefill + t for t in completion_texts(completions)]
        questions = [question_of(p) for p in prompts] or [""] * len(texts)
        refs = [str(a) for a in answer] if (with_reference and answer is not None) else [None] * len(texts)
        gate, before = asyncio.Semaphore(max(1, concurrency)), len(stats.latencies)
        try:
            chats = [judge_messages(q, t, r) for q, t, r in zip(questions, texts, refs)]
            unique = {json.dumps(c): c for c in chats}  # the same request twice in a batch: asked once
            stats.cache_hits += len(chats) - len(unique)
            async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout) as client:
                answers = dict(zip(unique, await asyncio.gather(*(ask(client, gate, c) for c in unique.values()))))
            results = [answers[json.dumps(c)] for c in chats]
        except Exception as exc:  # noqa: BLE001 - e.g. the client could not be built: no judge at all
            results = [(None, "", f"{type(exc).__name__}: {exc}")] * len(texts)
        new, n = stats.latencies[before:], max(1, len(texts))
        metrics = {FAILED: sum(bool(e) and e != "unparsed" for _, _, e in results) / n,
                   UNPARSED: sum(e == "unparsed" for _, _, e in results) / n, SECONDS: time.perf_counter() - start}
        metrics.update({LATENCY: sum(new) / len(new)} if new else {})
        for key, value in metrics.items() if log_metric is not None else ():
            log_metric(key, value)
        if log_extra is not None:
            log_extra(f"{name}_reply", [t if not e or e == "unparsed" else f"[{e}]" for _, t, e in results])
        if log_dir is not None:
            write_lines(Path(log_dir) / f"{name}.jsonl", [
                {"step": step_of(trainer_state), "question": q, "completion": t, "reply": r, "score": s, "error": e}
                for q, t, (s, r, e) in zip(questions, texts, results)])
        return [s for s, _, _ in results]

    reward.__name__ = reward.__qualname__ = name
    reward.stats, reward.cache = stats, memo  # type: ignore[attr-defined]
    return reward


def rubric_reward(gate: Callable[..., list], criteria: Sequence[tuple[Callable[..., Any], float]],
                  name: str = "rubric_reward") -> Callable[..., Any]:
    """An ``async def`` reward: 0 where ``gate`` gives 0, else the weighted mean of ``criteria`` (sync or async
    rewards) over those that answered (a ``None`` drops its weight); ``None`` where no criterion answered. Only the
    completions through the gate reach the criteria (the judge is asked nothing for the others)."""
    async def reward(prompts: Sequence[Any] = (), completions: Sequence[Any] = (), **kwargs: Any) -> list:
        n = len(completions)
        passed = [i for i, g in enumerate(gate(prompts=prompts, completions=completions, **kwargs)) if g]
        pick = lambda v: [v[i] for i in passed] if isinstance(v, (list, tuple)) and len(v) == n else v  # noqa: E731
        sub = {k: pick(v) for k, v in kwargs.items() if k != "log_extra"}
        total, weight = [0.0] * len(passed), [0.0] * len(passed)
        for func, w in criteria:
            out = func(prompts=pick(list(prompts)), completions=pick(list(completions)), **sub)
            out = await out if inspect.isawaitable(out) else out
            for j, value in enumerate(out):
                if value is not None and not (isinstance(value, float) and math.isnan(value)):
                    total[j], weight[j] = total[j] + w * float(value), weight[j] + w
        scores: list[float | None] = [0.0] * n
        for j, i in enumerate(passed):
            scores[i] = total[j] / weight[j] if weight[j] else None
        return scores

    reward.__name__ = reward.__qualname__ = name
    return reward


def cohen_kappa(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Cohen's kappa of two yes/no raters: 1 always agree, 0 as chance would (or one rater says one thing only)."""
    if (n := len(a)) == 0 or n != len(b):
        raise ValueError(f"kappa needs two equally long, non-empty lists (got {len(a)} and {len(b)})")
    observed = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(map(bool, a)) / n, sum(map(bool, b)) / n
    chance = pa * pb + (1 - pa) * (1 - pb)
    return 0.0 if chance >= 1 else (observed - chance) / (1 - chance)


def agreement(judge: Sequence[float | None], truth: Sequence[bool], threshold: float = 0.5) -> dict[str, float]:
    """The judge's scores against the verifier's verdicts, on the answered ones: agreement and kappa (a score at or
    above ``threshold`` is a yes), ``false_yes`` (yes to a wrong answer), ``false_no``, and ``auc``: how often a right
    answer outscores a wrong one, whatever the threshold (0.5: chance)."""
    scored = [(s, bool(t)) for s, t in zip(judge, truth) if s is not None]
    yes, pos, neg = [s >= threshold for s, _ in scored], [s for s, t in scored if t], [s for s, t in scored if not t]
    rate = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    return {"n": len(truth), "answered": len(scored) / max(1, len(truth)),
            "agreement": rate([y == t for y, (_, t) in zip(yes, scored)]),
            "kappa": cohen_kappa(yes, [t for _, t in scored]) if scored else 0.0,
            "false_yes": rate([s >= threshold for s in neg]), "false_no": rate([s < threshold for s in pos]),
            "auc": rate([(p > n) + 0.5 * (p == n) for p in pos for n in neg]) if pos and neg else 0.5}


def judge_warnings(history: Sequence[dict[str, Any]], key: str = FAILED) -> list[RunWarning]:
    """``judge-unavailable`` at the first step of each outage: a step where the judge answered none of the
    completions (``judge/failed`` 1) after one where it answered, or at the start."""
    found, down = [], False
    for entry in history:
        value = entry.get(key)
        if isinstance(value, (int, float)):
            if value >= 1.0 and not down:
                found.append(RunWarning("judge-unavailable", int(entry["step"]), "the judge answered none of this "
                                        "step's completions (judge/failed 1)", FIX))
            down = value >= 1.0
    return found


def stop_with_this_process(process: subprocess.Popen) -> None:
    """SIGTERM ``process``'s group once this Python process ends, however it ends (a kernel killed, not only exited):
    a small watchdog process polls both, and leaves by itself when the server has stopped first."""
    code = ("import os, signal, sys, time\nparent, group = int(sys.argv[1]), int(sys.argv[2])\n"
            "while os.getppid() == parent:\n    time.sleep(1)\n    try: os.killpg(group, 0)\n"
            "    except OSError: sys.exit()\ntry: os.killpg(group, signal.SIGTERM)\nexcept OSError: pass\n")
    subprocess.Popen([sys.executable, "-c", code, str(os.getpid()), str(process.pid)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _callback_class() -> type:
    from transformers import TrainerCallback

    from .callbacks import _trackio_alert, step_logs

    class JudgeWatchCallback(TrainerCallback):
        """Print each new :func:`judge_warnings` once (``WARNING [judge-unavailable] ...``), a trackio alert too."""

        def __init__(self, print_fn: Callable[[str], None] = print) -> None:
            self.print_fn, self.raised = print_fn, []

        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D102
            for warning in judge_warnings(step_logs(state.log_history))[len(self.raised):]:
                self.raised.append(warning)
                self.print_fn(f"WARNING {warning}")
                if "trackio" in (getattr(args, "report_to", None) or []):
                    _trackio_alert(warning)

    return JudgeWatchCallback


def __getattr__(name: str) -> Any:
    """``JudgeWatchCallback``, built when first asked for (it subclasses transformers' ``TrainerCallback``)."""
    if name == "JudgeWatchCallback":
        globals()[name] = _callback_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
