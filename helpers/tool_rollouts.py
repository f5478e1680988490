"""Rollouts through TRL's own tool loop, for showing one and for evaluating many: no second implementation.

Serves notebook 07.

``GRPOTrainer(tools=...)`` generates a rollout in its private ``_generate``: the model's turn, parsed for tool
calls (``parse_response``), the tools run, their replies appended as token ids, the model's next turn, until no
call is left or ``max_tool_calling_iterations`` is reached (trl/trainer/grpo_trainer.py 1985-2222, 2224-2345 in
TRL 1.13). :func:`rollouts` calls that very method, greedy for an evaluation, and keeps what it returns: the
messages the rewards see, the token ids, and ``tool_mask`` (1: tokens the model wrote, which the loss trains on;
0: the tools' replies, masked out of the loss). ``tests/test_tool_rollouts.py`` pins the method's contract.

Example:
    >>> right = {"accuracy": 1.0, "called": 1.0, "calls": 1.0, "unparsed": 0.0, "malformed": 0.0, "answered": 1.0}
    >>> unparsed = {"accuracy": 0.0, "called": 0.0, "calls": 0.0, "unparsed": 1.0, "malformed": 1.0, "answered": 1.0}
    >>> summary = summarize([right, unparsed])
    >>> summary["accuracy"], summary["tool_call_rate"], summary["malformed_call_rate"]
    (0.5, 0.5, 0.5)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from typing import Any, Callable, Iterator, Sequence

#: The generation settings TRL samples with, unset for greedy decoding.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p")


@dataclasses.dataclass
class Rollout:
    """One prompt's rollout as the trainer made it."""

    prompt: list[dict]  #: the prompt's messages
    messages: list[dict]  #: the completion as TRL's rewards get it: the model's turns and the tools' replies
    prompt_ids: list[int]
    completion_ids: list[int]  #: every token after the prompt: the model's turns and the tools' replies
    tool_mask: list[int]  #: per completion token: 1 the model wrote it (trained), 0 a tool's reply (masked)


@contextlib.contextmanager
def greedy(trainer: Any) -> Iterator[Any]:
    """Inside the block the trainer generates greedily (``do_sample=False``), in eval mode; as before after it."""
    saved = trainer.generation_config, trainer.generation_kwargs, trainer.model.training
    config = copy.deepcopy(trainer.generation_config)
    config.do_sample = False
    for name in _SAMPLING:
        setattr(config, name, None)
    trainer.generation_config = config
    trainer.generation_kwargs = {**(trainer.generation_kwargs or {}), "do_sample": False,
                                 **{name: None for name in _SAMPLING}}
    trainer.model.eval()
    try:
        yield trainer
    finally:
        trainer.generation_config, trainer.generation_kwargs = saved[:2]
        trainer.model.train(saved[2])


def rollouts(trainer: Any, prompts: Sequence[list[dict]], sample: bool = False, batch_size: int = 32) -> list[Rollout]:
    """Each prompt's rollout by ``trainer``'s own generation and tool loop; greedy unless ``sample``.

    ``trainer`` is a ``GRPOTrainer`` built with ``tools=``. With vLLM, TRL's engine samples with the training's
    settings whatever ``sample`` says."""
    if not getattr(trainer, "tools", None):
        raise ValueError("This trainer has no tools: build it as GRPOTrainer(..., tools=[your_function]).")
    if getattr(trainer, "environment_factories", None) is not None:
        raise ValueError("rollouts() runs the trainer's standalone tools; a trainer with environment_factory= "
                         "creates its environments per batch inside training only.")
    out: list[Rollout] = []
    tools = {tool.__name__: tool for tool in trainer.tools}
    report_to, trainer.args.report_to = trainer.args.report_to, []  # TRL's timers log to trackio, started by train()
    try:
        with contextlib.nullcontext() if sample else greedy(trainer):
            for start in range(0, len(prompts), batch_size):
                batch = [list(p) for p in prompts[start:start + batch_size]]
                # what _generate_and_score_completions sets up before calling _generate (one tool dict per rollout)
                trainer._sync_tool_dicts = [dict(tools) for _ in batch]
                trainer._async_tool_dicts = [{} for _ in batch]
                prompt_ids, completion_ids, tool_mask, completions = trainer._generate(batch)[:4]
                for i, prompt in enumerate(batch):
                    mask = list(tool_mask[i]) if tool_mask is not None else [1] * len(completion_ids[i])
                    out.append(Rollout(prompt, completions[i], list(prompt_ids[i]), list(completion_ids[i]), mask))
    finally:
        trainer.args.report_to = report_to
        for mode in ("train", "eval"):  # what _generate logged for the trainer's next log line: not a training step
            trainer._metrics[mode].clear()
    return out


def segments(tokenizer: Any, rollout: Rollout) -> list[tuple[str, bool]]:
    """The completion as runs of text, each with whether the loss trains on it (``tool_mask`` 1) or not.

    Example (a tokenizer that writes each id as a letter):
        >>> class Letters:
        ...     def decode(self, ids): return "".join(chr(96 + i) for i in ids)
        >>> segments(Letters(), Rollout([], [], [], [1, 2, 3, 4], [1, 1, 0, 1]))
        [('ab', True), ('c', False), ('d', True)]
    """
    runs: list[tuple[list[int], bool]] = []
    for token, keep in zip(rollout.completion_ids, rollout.tool_mask):
        if runs and runs[-1][1] == bool(keep):
            runs[-1][0].append(token)
        else:
            runs.append(([token], bool(keep)))
    return [(tokenizer.decode(ids), keep) for ids, keep in runs]


def summarize(scores: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Accuracy, tool-call rate, calls per answer and malformed-call rate of scored rollouts.

    ``tool_call_rate``: share of problems with at least one call TRL parsed. ``calls_per_answer``: calls per
    problem that ended in an answer. ``malformed_call_rate``: call attempts that failed (unparsable, or
    answered with an error) over all attempts (0 when none was made)."""
    n = len(scores)
    answered = [s for s in scores if s["answered"]]
    attempts = sum(s["calls"] + s.get("unparsed", 0.0) for s in scores)
    return {"accuracy": sum(s["accuracy"] for s in scores) / max(1, n),
            "tool_call_rate": sum(s["called"] for s in scores) / max(1, n),
            "calls_per_answer": sum(s["calls"] for s in answered) / max(1, len(answered)),
            "malformed_call_rate": sum(s["malformed"] for s in scores) / attempts if attempts else 0.0,
            "answered": len(answered) / max(1, n), "n": n}


def evaluate_with_tools(trainer: Any, rows: Sequence[dict], task: Any, batch_size: int = 32,
                        progress: Callable[[str], None] | None = print, label: str = "") -> dict[str, Any]:
    """Greedy rollouts of every row's ``prompt`` through the trainer's tool loop, scored by the task.

    Returns ``{"summary": summarize(...) + seconds, "rows": [{"index", "messages", **scores}]}``."""
    start = time.perf_counter()
    done = rollouts(trainer, [row["prompt"] for row in rows], batch_size=batch_size)
    scored = [{"index": i, "messages": r.messages, **task.score_messages(r.messages, row)}
              for i, (r, row) in enumerate(zip(done, rows))]
    summary = {**summarize(scored), "seconds": round(time.perf_counter() - start, 1)}
    if progress is not None:
        progress(f"{label or 'model'}: accuracy {summary['accuracy']:.0%}, tool-call rate "
                 f"{summary['tool_call_rate']:.0%}, calls per answer {summary['calls_per_answer']:.2f}, malformed "
                 f"calls {summary['malformed_call_rate']:.0%} ({summary['n']} problems, {summary['seconds']} s)")
    return {"summary": summary, "rows": scored}
