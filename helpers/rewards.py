"""Reward functions for GRPO, written to TRL's calling convention.

TRL's ``GRPOTrainer`` calls every reward as
``f(prompts=..., completions=..., completion_ids=..., **kwargs)`` where the
kwargs carry the dataset's columns as lists (``answer=[...]``) plus a few
trainer objects. Every reward here:

- accepts completions as plain strings *or* conversational lists
  (``[{"role": "assistant", "content": ...}]``), and ``None`` content;
- returns one ``float`` per completion (``None`` only where documented: "this
  reward does not apply", which TRL skips);
- never raises, whatever the text (empty, huge, unicode, broken tags): a
  scorer that fails on one completion gives that completion ``0.0``.

The response format (tags) comes from :mod:`helpers.prompts`, shared with the
data module::

    <reasoning>
    15 + 27 = 42
    </reasoning>
    <answer>
    42
    </answer>

Example:
    >>> from helpers.rewards import correctness_reward, strict_format_reward
    >>> good = "<reasoning>\\n15 + 27 = 42\\n</reasoning>\\n<answer>\\n42\\n</answer>"
    >>> correctness_reward(completions=[good, "42"], answer=["42", "42"])
    [2.0, 0.0]
    >>> strict_format_reward(completions=[[{"role": "assistant", "content": good}]])
    [1.0]
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, Sequence

from .prompts import ANSWER_END, ANSWER_START, REASONING_END, REASONING_START

RewardFunc = Callable[..., list]
"""A TRL reward: ``f(prompts=None, completions=..., completion_ids=None, **kwargs) -> list[float | None]``."""

__all__ = [
    "RewardFunc", "completion_text", "completion_texts", "extract_answer", "extract_reasoning",
    "normalize_number", "find_numbers", "prefill_of", "make_reward",
    "strict_format_reward", "soft_format_reward", "xmlcount_reward", "correctness_reward",
    "numeric_answer_reward", "partial_correctness_reward", "math_verify_reward",
    "get_math_verify_reward", "run_with_time_limit", "TimeLimitedWorker", "get_target_length_reward", "get_repetition_penalty_reward",
    "get_soft_overlong_punishment_reward", "get_prefilled_format_reward", "with_prefill",
    "get_partial_correctness_reward", "PRESETS", "get_preset", "split_preset",
]


# --------------------------------------------------------------------------- text access


def _content_to_str(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal parts: [{"type": "text", "text": ...}]
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(_content_to_str(part.get("text", part.get("content"))))
            else:
                parts.append(_content_to_str(part))
        return "".join(parts)
    return str(content)


def completion_text(completion: Any) -> str:
    """The text of one completion, plain or conversational; ``""`` for ``None``.

    A conversational completion is a list of messages; the contents of its
    assistant messages are joined with newlines (all messages if none is
    marked assistant).

    Example:
        >>> completion_text([{"role": "assistant", "content": "hi"}])
        'hi'
        >>> completion_text(None)
        ''
    """
    try:
        if completion is None:
            return ""
        if isinstance(completion, str):
            return completion
        if isinstance(completion, dict):
            return _content_to_str(completion.get("content"))
        if isinstance(completion, (list, tuple)):
            msgs = [m for m in completion if isinstance(m, dict)]
            if not msgs:
                return _content_to_str(list(completion))
            chosen = [m for m in msgs if m.get("role") == "assistant"] or msgs
            return "\n".join(_content_to_str(m.get("content")) for m in chosen)
        return str(completion)
    except Exception:  # a reward never raises; an unreadable object scores as empty text
        return ""


def completion_texts(completions: Any) -> list[str]:
    """:func:`completion_text` of each completion (``None`` gives ``[]``).

    Example:
        >>> completion_texts(["a", [{"role": "assistant", "content": "b"}]])
        ['a', 'b']
    """
    if completions is None:
        return []
    if isinstance(completions, str):  # one bare string: treat it as one completion
        return [completions]
    return [completion_text(c) for c in completions]


def _last_block(text: str, start_tag: str, end_tag: str) -> str | None:
    end = text.rfind(end_tag)
    if end < 0:
        return None
    start = text.rfind(start_tag, 0, end)
    if start < 0:
        return None
    return text[start + len(start_tag) : end].strip()


def extract_answer(text: Any) -> str | None:
    """The stripped content of the last complete ``<answer>...</answer>`` block, or ``None``.

    Example:
        >>> extract_answer("<answer>\\n 41 \\n</answer> then <answer>42</answer>")
        '42'
        >>> extract_answer("<answer>42") is None
        True
    """
    if not isinstance(text, str):
        text = completion_text(text)
    return _last_block(text, ANSWER_START, ANSWER_END)


def extract_reasoning(text: Any) -> str | None:
    """The stripped content of the last complete ``<reasoning>...</reasoning>`` block, or ``None``.

    Example:
        >>> extract_reasoning("<reasoning>\\n2 + 2 = 4\\n</reasoning>")
        '2 + 2 = 4'
    """
    if not isinstance(text, str):
        text = completion_text(text)
    return _last_block(text, REASONING_START, REASONING_END)


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_DIGIT_SPACE_DIGIT = re.compile(r"\d\s+[\d.]|[\d.]\s+\d")


def normalize_number(text: Any) -> str | None:
    """A canonical string for a number written as text, or ``None`` unless it is one number.

    Drops ``$``, ``%``, thousands commas, spaces and a trailing period, a leading
    ``+`` and leading zeros, and trailing zeros after a decimal point.

    Example:
        >>> [normalize_number(s) for s in ["$1,234", "18.00", "3.50", "-7", "42.", "1 2", "x"]]
        ['1234', '18', '3.5', '-7', '42', None, None]
    """
    if text is None:
        return None
    try:
        s = str(text) if not isinstance(text, str) else text
        if len(s) > 200:  # no real answer is this long; keeps the function O(1)-ish
            return None
        s = s.strip().replace("\u2212", "-")  # unicode minus sign
        s = s.replace("$", "").replace("%", "")
        if _DIGIT_SPACE_DIGIT.search(s):
            return None  # "1 2" is two numbers
        s = "".join(s.split())
        if s.endswith("."):
            s = s[:-1]
        if "," in s:
            if not _THOUSANDS.fullmatch(s):
                return None
            s = s.replace(",", "")
        if not _NUMBER.fullmatch(s):
            return None
        sign = "-" if s.startswith("-") else ""
        s = s.lstrip("+-")
        whole, _, frac = s.partition(".")
        whole = whole.lstrip("0") or "0"
        frac = frac.rstrip("0")
        out = whole + ("." + frac if frac else "")
        if out == "0":
            sign = ""
        return sign + out
    except Exception:
        return None


_NUMBER_IN_TEXT = re.compile(r"(?<![\w.])[+-]?\$?\d[\d,]*(?:\.\d+)?")


def find_numbers(text: Any, limit: int = 1000) -> list[str]:
    """Every number in the text, normalised, in order (at most ``limit``).

    Example:
        >>> find_numbers("15 + 27 = 42, so $1,042.50 in all.")
        ['15', '27', '42', '1042.5']
    """
    if not isinstance(text, str):
        text = completion_text(text)
    out: list[str] = []
    for m in _NUMBER_IN_TEXT.finditer(text):
        n = normalize_number(m.group(0).rstrip(","))
        if n is not None:
            out.append(n)
            if len(out) >= limit:
                break
    return out


def prefill_of(prompt: Any) -> str:
    """The text the prompt prefilled into the assistant turn, or ``""``.

    A conversational prompt whose last message is from the assistant is
    *continued* by TRL (and by :func:`helpers.generation.generate`): that
    message's content is a prefill the completion does not contain. A plain
    prompt ending with ``<reasoning>`` prefilled that tag.

    Example:
        >>> prefill_of([{"role": "user", "content": "2+2?"},
        ...             {"role": "assistant", "content": "<reasoning>\\n"}])
        '<reasoning>\\n'
        >>> prefill_of("... <|im_start|>assistant\\n")
        ''
    """
    try:
        if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[-1], dict):
            if prompt[-1].get("role") == "assistant":
                return _content_to_str(prompt[-1].get("content"))
            return ""
        if isinstance(prompt, str):
            stripped = prompt.rstrip(" \t")
            for tail in (REASONING_START + "\n", REASONING_START):
                if stripped.endswith(tail):
                    return tail
        return ""
    except Exception:
        return ""


# --------------------------------------------------------------------------- the wrapper


def _columns_for(kwargs: dict[str, Any], n: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Split kwargs into per-row values (lists of length n) and shared values."""
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    shared: dict[str, Any] = {}
    for key, value in kwargs.items():
        if isinstance(value, (list, tuple)) and len(value) == n:
            for i in range(n):
                rows[i][key] = value[i]
        else:
            shared[key] = value
    return rows, shared


class make_reward:
    """Turn a per-completion scorer into a TRL batch reward that never raises.

    ``score(text, **row)`` gets the completion's text and that row's values
    (``prompt``, ``completion_ids``, every dataset column such as ``answer``,
    plus shared trainer kwargs); it returns a float or ``None``. An exception
    gives ``on_error`` (default ``0.0``) for that completion and is counted in
    ``self.errors``. The result is picklable when ``score`` is a module-level
    function.

    Example:
        >>> def says_hello(text, **_):
        ...     return 1.0 if "hello" in text.lower() else 0.0
        >>> hello_reward = make_reward(says_hello, name="hello_reward")
        >>> hello_reward(completions=["Hello!", [{"role": "assistant", "content": "bye"}]])
        [1.0, 0.0]
        >>> hello_reward.__name__
        'hello_reward'
    """

    def __init__(
        self,
        score: Callable[..., float | None],
        name: str | None = None,
        on_error: float | None = 0.0,
        doc: str | None = None,
    ) -> None:
        self.score = score
        self.__name__ = name or getattr(score, "__name__", "custom_reward")
        if not self.__name__.endswith("_reward"):
            self.__name__ += "_reward"
        self.__qualname__ = self.__name__
        self.__doc__ = doc or getattr(score, "__doc__", None)
        self.on_error = on_error
        self.errors = 0
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return f"<reward {self.__name__}>"

    def __call__(
        self, prompts: Any = None, completions: Any = None, completion_ids: Any = None, **kwargs: Any
    ) -> list[float | None]:
        try:
            texts = completion_texts(completions)
            n = len(texts)
            rows, shared = _columns_for(kwargs, n)
            prompt_list = list(prompts) if isinstance(prompts, (list, tuple)) and len(prompts) == n else [None] * n
            ids_list = (
                list(completion_ids)
                if isinstance(completion_ids, (list, tuple)) and len(completion_ids) == n
                else [None] * n
            )
        except Exception as exc:  # pathological container: still never raise
            self.errors += 1
            self.last_error = repr(exc)[:300]
            try:
                return [self.on_error] * len(completions)
            except Exception:
                return []
        out: list[float | None] = []
        for i, text in enumerate(texts):
            try:
                row = {**shared, **rows[i]}
                if "text" in row:  # a dataset column named "text" must not shadow the completion
                    row["text_column"] = row.pop("text")
                row["prompt"], row["completion_ids"] = prompt_list[i], ids_list[i]
                value = self.score(text, **row)
                out.append(None if value is None else float(value))
            except Exception as exc:
                self.errors += 1
                self.last_error = repr(exc)[:300]
                out.append(self.on_error)
        return out


# --------------------------------------------------------------------------- format rewards


_STRICT = re.compile(
    re.escape(REASONING_START) + r"[ \t]*\n(.*?)\n[ \t]*" + re.escape(REASONING_END)
    + r"\s*" + re.escape(ANSWER_START) + r"[ \t]*\n(.*?)\n[ \t]*" + re.escape(ANSWER_END),
    re.DOTALL,
)
_TAGS = (REASONING_START, REASONING_END, ANSWER_START, ANSWER_END)


def _strict_format(text: str, **_: Any) -> float:
    """1.0 when the whole text is one reasoning block then one answer block, each multi-line."""
    t = text.strip()
    if any(t.count(tag) != 1 for tag in _TAGS):
        return 0.0
    m = _STRICT.fullmatch(t)
    if m is None or not m.group(1).strip() or not m.group(2).strip():
        return 0.0
    return 1.0


def _soft_format(text: str, **_: Any) -> float:
    """1.0 when a complete reasoning block comes before a complete answer block, anywhere."""
    r = text.find(REASONING_START)
    if r < 0:
        return 0.0
    re_ = text.find(REASONING_END, r + len(REASONING_START))
    if re_ < 0:
        return 0.0
    a = text.find(ANSWER_START, re_ + len(REASONING_END))
    if a < 0:
        return 0.0
    return 1.0 if text.find(ANSWER_END, a + len(ANSWER_START)) >= 0 else 0.0


def _xmlcount(text: str, **_: Any) -> float:
    """+0.25 per tag used exactly once, -0.125 per repeated tag, -0.001 per char after </answer>."""
    score = 0.0
    for tag in _TAGS:
        c = text.count(tag)
        if c == 1:
            score += 0.25
        elif c > 1:
            score -= 0.125
    end = text.rfind(ANSWER_END)
    if end >= 0:
        trailing = text[end + len(ANSWER_END) :].strip()
        score -= min(0.5, 0.001 * len(trailing))
    return max(-1.0, min(1.0, score))


strict_format_reward = make_reward(
    _strict_format,
    "strict_format_reward",
    doc="1.0 when the completion (outer whitespace aside) is exactly one reasoning block then one "
    "answer block, each tag on its own line with non-empty content; else 0.0. DOTALL: "
    "multi-line reasoning is fine.",
)
soft_format_reward = make_reward(
    _soft_format,
    "soft_format_reward",
    doc="1.0 when a complete <reasoning>...</reasoning> comes before a complete "
    "<answer>...</answer> anywhere in the text (any spacing, text around allowed); else 0.0.",
)
xmlcount_reward = make_reward(
    _xmlcount,
    "xmlcount_reward",
    doc="Partial credit per tag: +0.25 for each of the four tags used exactly once, -0.125 for "
    "each tag used more than once, minus 0.001 per character after the last </answer> (at most "
    "0.5). Clamped to [-1, 1]; 1.0 for a perfect completion.",
)


# --------------------------------------------------------------------------- answer rewards


def _gold(answer: Any) -> str | None:
    if answer is None:
        return None
    s = str(answer).strip()
    if not s:
        return None
    return normalize_number(s) or s


def _correctness(text: str, answer: Any = None, **_: Any) -> float:
    """2.0 when the extracted answer equals the gold answer (numbers normalised)."""
    gold = _gold(answer)
    pred = extract_answer(text)
    if gold is None or pred is None or not pred:
        return 0.0
    return 2.0 if (normalize_number(pred) or pred) == gold else 0.0


def _numeric(text: str, **_: Any) -> float:
    """0.5 when the extracted answer is a single number."""
    pred = extract_answer(text)
    return 0.5 if pred is not None and normalize_number(pred) is not None else 0.0


correctness_reward = make_reward(
    _correctness,
    "correctness_reward",
    doc="2.0 when normalize_number(extract_answer(completion)) equals normalize_number(answer) "
    "(a non-numeric gold answer is compared as stripped text); else 0.0. Needs the `answer` "
    "column; a missing or empty gold answer gives 0.0.",
)
numeric_answer_reward = make_reward(
    _numeric,
    "numeric_answer_reward",
    doc="0.5 when the answer block holds a single number (right or wrong); else 0.0.",
)


class get_partial_correctness_reward(make_reward):
    """Partial credit for the right number, for models too small to get the format first.

    - ``exact`` (1.0) when the answer block is the right number;
    - ``in_answer`` (0.5) when the right number is one of the numbers in the answer block;
    - ``final_number`` (0.25) when the *last* number anywhere in the completion is
      the right one (with or without tags).

    Using the last number (not "any number") means listing many numbers does not
    pay. Returns ``None`` when the row has no numeric gold answer.

    Example:
        >>> r = get_partial_correctness_reward()
        >>> r(completions=["<answer>13</answer>", "<answer>5+8=13</answer>", "5 + 8 = 13", "13 or 12"],
        ...   answer=["13"] * 4)
        [1.0, 0.5, 0.25, 0.0]
    """

    def __init__(self, exact: float = 1.0, in_answer: float = 0.5, final_number: float = 0.25,
                 name: str = "partial_correctness_reward") -> None:
        self.exact, self.in_answer, self.final_number = exact, in_answer, final_number
        super().__init__(self._score, name)

    def _score(self, text: str, answer: Any = None, **_: Any) -> float | None:
        gold = normalize_number(answer)
        if gold is None:
            return None
        block = extract_answer(text)
        if block is not None:
            if normalize_number(block) == gold:
                return self.exact
            if gold in find_numbers(block):
                return self.in_answer
        nums = find_numbers(text.replace(ANSWER_END, " ").replace(REASONING_END, " "))
        if nums and nums[-1] == gold:
            return self.final_number
        return 0.0


partial_correctness_reward = get_partial_correctness_reward()


# --------------------------------------------------------------------------- math-verify


class _GuardTimeout(BaseException):
    """Raised inside a guarded call when its time is up (BaseException: not swallowed)."""


def run_with_time_limit(fn: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    """Run ``fn()`` for at most ``seconds`` in the main thread; returns ``(finished, result)``.

    A ``SIGALRM`` interval timer interrupts the call (TRL's trainer calls
    rewards in the main thread, and so does a notebook cell). Signals only work
    in the main thread, so elsewhere this raises ``RuntimeError``: use
    :class:`TimeLimitedWorker` (a child process that can be killed) there.
    A long single C call (a giant integer power) is only interrupted when it
    returns, which is why :func:`get_math_verify_reward` also screens inputs.

    Example:
        >>> run_with_time_limit(lambda: 6 * 7, 1.0)
        (True, 42)
    """
    import signal

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        raise RuntimeError(
            "run_with_time_limit needs the main thread (SIGALRM); use TimeLimitedWorker elsewhere."
        )
    if signal.getitimer(signal.ITIMER_REAL)[0] != 0.0:
        return True, fn()  # someone else's timer is running: do not clobber it

    def _handler(signum: int, frame: Any) -> None:
        raise _GuardTimeout()

    old = signal.signal(signal.SIGALRM, _handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return True, fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _GuardTimeout:
        return False, None
    finally:
        signal.signal(signal.SIGALRM, old)


def _math_verify_equal(gold_text: str, pred_text: str) -> bool | None:
    """None when the gold does not parse, else whether math-verify finds them equivalent."""
    from math_verify import parse, verify

    _quiet_math_verify()
    gold = parse(gold_text, parsing_timeout=None)
    if not gold:
        return None
    pred = parse(pred_text, parsing_timeout=None)
    return bool(pred) and bool(verify(gold, pred, timeout_seconds=None))


def _worker_main(conn: Any) -> None:  # runs in the child process
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        if job == "ping":  # warm up (imports) before the parent starts timing jobs
            _math_verify_equal("1/2", "\\frac{1}{2}")
            conn.send(("ok", None))
            continue
        try:
            conn.send(("ok", _math_verify_equal(*job)))
        except Exception as exc:  # noqa: BLE001
            conn.send(("error", repr(exc)[:300]))


class TimeLimitedWorker:
    """A child process that runs math-verify checks and is killed when one overruns.

    Used when rewards are called outside the main thread (an async trainer,
    a widget running in a thread). Started on first use (spawn: ~1 s to import
    math-verify), restarted after a kill, stopped by :meth:`close` or when the
    parent exits (daemon).

    Example:
        >>> w = TimeLimitedWorker()
        >>> w.check("1/2", "0.5", seconds=30)      # doctest: +SKIP
        (True, True)
        >>> w.close()
    """

    def __init__(self) -> None:
        self._proc: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # fork is unsafe in a process with torch threads
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="math-verify-guard")
        self._proc.start()
        self._conn = parent

    def check(self, gold_text: str, pred_text: str, seconds: float) -> tuple[bool, bool | None]:
        """``(finished, equal_or_None)``; the first call also waits for the worker to start."""
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
                self._conn.send("ping")  # wait for the child to start, outside the time limit
                if not self._conn.poll(120.0):
                    self.close(kill=True)
                    return False, None
                self._conn.recv()
            self._conn.send((gold_text, pred_text))
            if self._conn.poll(seconds):
                status, value = self._conn.recv()
                return True, (value if status == "ok" else False)
            self.close(kill=True)
            return False, None

    def close(self, kill: bool = False) -> None:
        """Stop the worker process (if any)."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None:
            return
        try:
            if not kill and proc.is_alive():
                conn.send(None)
                proc.join(2)
        except Exception:
            pass
        if proc.is_alive():
            proc.kill()
        proc.join(5)

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()


#: Patterns math-verify/sympy can spend unbounded time or memory on (power towers, huge
#: factorials); answers matching them score 0.0 without being parsed, and are counted.
_DANGEROUS = re.compile(r"(\^|\*\*)[^\n]*(\^|\*\*)|\d{7,}\s*!|\d{400,}")


class get_math_verify_reward(make_reward):
    """Equivalence with the gold answer by math-verify (fractions, LaTeX, ``\\boxed{}``).

    Scores ``correct`` (1.0) or 0.0; ``None`` when the gold answer does not
    parse (TRL then skips the row). With ``use_answer_block=True`` (default)
    it judges the content of the last ``<answer>`` block (no block: 0.0);
    otherwise the whole completion.

    The guard, in layers: answers longer than ``max_chars`` or matching known
    bomb patterns (power towers, huge factorials) score 0.0 without parsing;
    then parse + verify get at most ``time_limit`` seconds per completion, by a
    SIGALRM timer in the main thread (TRL's trainer, notebooks) or by a
    killable child process (:class:`TimeLimitedWorker`) in any other thread.
    ``self.stats`` counts timeouts and skips, so nothing is dropped silently.
    math-verify's own signal-based timeouts are switched off (ours replace
    them), and its loggers are lowered to ERROR so it does not warn about that
    (TRL's ``accuracy_reward`` does the same off the main thread).

    Example:
        >>> mv = get_math_verify_reward()
        >>> mv(completions=["<answer>\\\\frac{1}{2}</answer>", "<answer>0.5</answer>",
        ...                 "<answer>2</answer>"], answer=["1/2", "1/2", "nonsense ?"])
        [1.0, 1.0, None]
    """

    def __init__(self, time_limit: float = 1.0, max_chars: int = 300, use_answer_block: bool = True,
                 correct: float = 1.0, name: str = "math_verify_reward") -> None:
        self.time_limit = time_limit
        self.max_chars = max_chars
        self.use_answer_block = use_answer_block
        self.correct = correct
        self.stats = {"calls": 0, "timeouts": 0, "too_long": 0, "dangerous": 0, "gold_unparsed": 0}
        self.worker = TimeLimitedWorker()
        self._warm = False
        self._gold_ok: dict[str, bool] = {}  # gold text -> parses (learned from finished checks)
        super().__init__(self._score, name)

    def _score(self, text: str, answer: Any = None, **_: Any) -> float | None:
        self.stats["calls"] += 1
        gold_text = "" if answer is None else str(answer).strip()
        if not gold_text or len(gold_text) > self.max_chars or _DANGEROUS.search(gold_text):
            self.stats["gold_unparsed"] += 1
            return None
        pred_text = extract_answer(text) if self.use_answer_block else text.strip()
        if not pred_text:
            pred_text = ""
        elif len(pred_text) > self.max_chars:
            self.stats["too_long"] += 1
            pred_text = ""
        elif _DANGEROUS.search(pred_text):
            self.stats["dangerous"] += 1
            pred_text = ""
        known = self._gold_ok.get(gold_text)
        if not pred_text and known is not None:  # nothing to compare: no parse, no worker call
            if not known:
                self.stats["gold_unparsed"] += 1
            return 0.0 if known else None
        if threading.current_thread() is threading.main_thread():
            if not self._warm:
                # Import and warm math-verify's parsers *outside* the time limit: a timer that
                # fires in the middle of an import leaves the module half-initialised.
                _math_verify_equal("1/2", "\\frac{1}{2}")
                self._warm = True
            finished, same = run_with_time_limit(
                lambda: _math_verify_equal(gold_text, pred_text), self.time_limit
            )
        else:
            finished, same = self.worker.check(gold_text, pred_text, self.time_limit)
        if not finished:
            self.stats["timeouts"] += 1
            return 0.0
        if len(self._gold_ok) < 10_000:
            self._gold_ok[gold_text] = same is not None
        if same is None:
            self.stats["gold_unparsed"] += 1
            return None
        return self.correct if same else 0.0


def _quiet_math_verify() -> None:
    """math-verify warns once when its own (signal) timeouts are off; ours replace them."""
    import logging

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)


math_verify_reward = get_math_verify_reward()


# --------------------------------------------------------------------------- shaping factories


def _length_of(text: str, completion_ids: Any, unit: str) -> int | None:
    if unit == "tokens":
        return len(completion_ids) if completion_ids is not None else None
    if unit == "words":
        return len(text.split())
    return len(text)


class get_target_length_reward(make_reward):
    """1.0 at ``target`` length, falling linearly to 0.0 at 0 and at twice the target.

    ``unit`` is ``"tokens"`` (from ``completion_ids``; ``None`` when the trainer
    did not pass them), ``"words"`` or ``"chars"``.

    Example:
        >>> r = get_target_length_reward(10, unit="words")
        >>> r(completions=["one two three four five", " ".join(["w"] * 10), " ".join(["w"] * 30)])
        [0.5, 1.0, 0.0]
        >>> r.__name__
        'target_length_10_words_reward'
    """

    def __init__(self, target: int, unit: str = "tokens", name: str | None = None) -> None:
        if target <= 0:
            raise ValueError(f"target must be a positive length, got {target}.")
        if unit not in ("tokens", "words", "chars"):
            raise ValueError(f"unit must be 'tokens', 'words' or 'chars', got {unit!r}.")
        self.target, self.unit = int(target), unit
        super().__init__(self._score, name or f"target_length_{target}_{unit}_reward")

    def _score(self, text: str, completion_ids: Any = None, **_: Any) -> float | None:
        n = _length_of(text, completion_ids, self.unit)
        if n is None:
            return None
        return max(0.0, 1.0 - abs(n - self.target) / self.target)


class get_repetition_penalty_reward(make_reward):
    """Penalty for repeated n-grams: ``max_penalty * (1 - unique/total)``, in ``[max_penalty, 0]``.

    Uses TRL's own ``trl.rewards.get_repetition_penalty_reward`` on words
    (``unit="words"``, default: works without token ids) or on
    ``completion_ids`` (``unit="tokens"``, as the DAPO/Demystifying papers do).

    Example:
        >>> r = get_repetition_penalty_reward(ngram_size=2)
        >>> r(completions=["a b c d", "a a a a a"])
        [0.0, -0.75]
    """

    def __init__(self, ngram_size: int = 3, max_penalty: float = -1.0, unit: str = "words",
                 name: str | None = None) -> None:
        if max_penalty > 0:
            raise ValueError(f"max_penalty must be <= 0 (it is a penalty), got {max_penalty}.")
        if unit not in ("tokens", "words"):
            raise ValueError(f"unit must be 'tokens' or 'words', got {unit!r}.")
        self.ngram_size, self.max_penalty, self.unit = ngram_size, max_penalty, unit
        self._trl: Any = None
        super().__init__(self._score, name or f"repetition_penalty_{ngram_size}gram_reward")

    def _score(self, text: str, completion_ids: Any = None, **_: Any) -> float | None:
        if self._trl is None:
            from trl.rewards import get_repetition_penalty_reward as trl_penalty

            self._trl = trl_penalty(self.ngram_size, self.max_penalty)
        if self.unit == "tokens":
            if completion_ids is None:
                return None
            seq = list(completion_ids)
        else:
            seq = text.lower().split()
        return float(self._trl(completion_ids=[seq])[0])


class get_soft_overlong_punishment_reward(make_reward):
    """DAPO's soft overlong punishment on ``completion_ids`` (TRL's implementation).

    0 up to ``max_completion_len - soft_punish_cache`` tokens, then linearly
    down to -1 at ``max_completion_len``, and -1 beyond. ``None`` when the
    trainer did not pass ``completion_ids``.

    Example:
        >>> r = get_soft_overlong_punishment_reward(100, 20)
        >>> r(completions=["a", "b", "c"], completion_ids=[[1] * 50, [1] * 90, [1] * 120])
        [0.0, -0.5, -1.0]
    """

    def __init__(self, max_completion_len: int, soft_punish_cache: int, name: str | None = None) -> None:
        if not 0 < soft_punish_cache <= max_completion_len:
            raise ValueError(
                f"soft_punish_cache ({soft_punish_cache}) must be in 1..max_completion_len "
                f"({max_completion_len}); e.g. a fifth of max_completion_length."
            )
        self.max_completion_len, self.soft_punish_cache = max_completion_len, soft_punish_cache
        self._trl: Any = None
        super().__init__(self._score, name or "soft_overlong_punishment_reward")

    def _score(self, text: str, completion_ids: Any = None, **_: Any) -> float | None:
        if completion_ids is None:
            return None
        if self._trl is None:
            from trl.rewards import get_soft_overlong_punishment

            self._trl = get_soft_overlong_punishment(self.max_completion_len, self.soft_punish_cache)
        return float(self._trl(completion_ids=[list(completion_ids)])[0])


# --------------------------------------------------------------------------- prefill


class with_prefill(make_reward):
    """Make any text reward aware of a prefilled assistant turn.

    When the prompt prefills the start of the answer (e.g. ``"<reasoning>\\n"``
    as the last assistant message, which TRL continues), the completion starts
    *inside* the reasoning block and lacks the opening tag. This wrapper puts
    the prefill back in front of each completion before scoring. ``prefill=None``
    detects it per row from ``prompts`` (see :func:`prefill_of`); a string
    forces it (e.g. a chat template that adds ``<think>`` itself).

    Example:
        >>> r = with_prefill(strict_format_reward)
        >>> prompt = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<reasoning>\\n"}]
        >>> r(prompts=[prompt], completions=["2 + 2 = 4\\n</reasoning>\\n<answer>\\n4\\n</answer>"])
        [1.0]
        >>> r.__name__
        'prefilled_strict_format_reward'
    """

    def __init__(self, reward: RewardFunc, prefill: str | None = None, name: str | None = None) -> None:
        self.reward, self.prefill = reward, prefill
        base = getattr(reward, "__name__", "reward")
        super().__init__(self._score, name or f"prefilled_{base}", doc=getattr(reward, "__doc__", None))

    def _score(self, text: str, prompt: Any = None, completion_ids: Any = None, **row: Any) -> float | None:
        pre = self.prefill if self.prefill is not None else prefill_of(prompt)
        full = pre + text  # a model that writes the prefilled tag again now shows it twice
        cols = {k: [v] for k, v in row.items()}
        ids = [completion_ids] if completion_ids is not None else None
        return self.reward(prompts=[prompt], completions=[full], completion_ids=ids, **cols)[0]


def get_prefilled_format_reward(prefill: str | None = None, strict: bool = True) -> with_prefill:
    """The strict (or soft) format reward, knowing the chat template prefilled the opening tag.

    Example:
        >>> r = get_prefilled_format_reward(prefill="<reasoning>\\n")
        >>> r(completions=["5 + 8 = 13\\n</reasoning>\\n<answer>\\n13\\n</answer>", "13"])
        [1.0, 0.0]
    """
    return with_prefill(strict_format_reward if strict else soft_format_reward, prefill=prefill)


# --------------------------------------------------------------------------- presets


def _preset(name: str) -> list[tuple[RewardFunc, float]]:
    if name == "format-only":
        return [
            (with_prefill(strict_format_reward), 1.0),
            (with_prefill(soft_format_reward), 0.5),
            (with_prefill(xmlcount_reward), 0.5),
        ]
    if name == "arithmetic":
        return [
            (correctness_reward, 1.0),
            (partial_correctness_reward, 0.5),
            (with_prefill(strict_format_reward), 0.5),
            (with_prefill(xmlcount_reward), 0.25),
        ]
    if name == "gsm8k":
        return [
            (correctness_reward, 1.0),
            (numeric_answer_reward, 1.0),
            (with_prefill(strict_format_reward), 0.5),
            (with_prefill(soft_format_reward), 0.5),
            (with_prefill(xmlcount_reward), 0.5),
        ]
    raise ValueError(f"Unknown reward preset {name!r}. Valid presets: {', '.join(PRESETS)}.")


PRESETS: dict[str, str] = {
    "format-only": "stage 1: only the response format (prefill-aware strict + soft + xmlcount)",
    "arithmetic": "synthetic sums: correctness 2.0 + partial credit + prefill-aware format",
    "gsm8k": "GSM8K: correctness + numeric answer + prefill-aware strict/soft format + xmlcount",
}
"""Preset names and what each rewards; build one with :func:`get_preset`."""


def get_preset(name: str) -> list[tuple[RewardFunc, float]]:
    """A fresh list of ``(reward_function, weight)`` for a course task.

    Every format reward in a preset detects a prefilled ``<reasoning>`` from
    the prompt, so the same preset works with and without prefill.

    Example:
        >>> [(f.__name__, w) for f, w in get_preset("format-only")]
        [('prefilled_strict_format_reward', 1.0), ('prefilled_soft_format_reward', 0.5), ('prefilled_xmlcount_reward', 0.5)]
    """
    return _preset(name)


def split_preset(preset: Sequence[tuple[RewardFunc, float]]) -> tuple[list[RewardFunc], list[float]]:
    """``(reward_funcs, reward_weights)`` for ``GRPOTrainer(reward_funcs=...)`` and ``GRPOConfig(reward_weights=...)``.

    Example:
        >>> funcs, weights = split_preset(get_preset("arithmetic"))
        >>> weights
        [1.0, 0.5, 0.5, 0.25]
    """
    funcs = [f for f, _ in preset]
    weights = [float(w) for _, w in preset]
    return funcs, weights

