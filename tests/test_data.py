"""helpers.data: validation against a task, dedupe, token counts, the split, prepare/save/load, ensure_prepared.

The fast tests count tokens with a stand-in chat tokenizer (one token per word; prepare_dataset only renders and
counts); the tests that need the bundled tokenizer's exact counts are marked slow.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers import data as D
from helpers.profiles import get_profile
from helpers.prompts import build_prompt, encode
from helpers.tasks import Task, get_task
from helpers.tasks.arithmetic import GSM8K_DIR_ENV, generate_arithmetic
from helpers.tasks.reasoning import PREFILL, SYSTEM_PROMPT, normalize_number

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "gsm8k_sample"
BROKEN_CSV = ROOT / "data" / "custom_broken.csv"
ARITHMETIC = get_task("arithmetic")


class AnyAnswer(Task):
    """A task that keeps the interface's default ``clean_answer``: any non-empty text is an answer."""

    name = "any-answer"


class WordTokenizer:
    """A stand-in chat tokenizer: renders ``<role> content`` turns and gives one token per word, through the
    ``apply_chat_template`` calls TRL and helpers.prompts make. ``system_role=False`` refuses a system message
    (Gemma 2's template raises); ``enable_thinking=False`` adds a word, as Qwen3's template adds ``<think></think>``."""

    def __init__(self, system_role: bool = True):
        self.chat_template = "words"
        self.system_role = system_role

    def _render(self, messages, add_generation_prompt=False, enable_thinking=None):
        if not self.system_role and any(m["role"] == "system" for m in messages):
            raise ValueError("System role not supported")
        text = " ".join(f"<{m['role']}> {m['content']}" for m in messages)
        return text + (" <assistant>" if add_generation_prompt else "") + (" nothink" if enable_thinking is False else "")

    def apply_chat_template(self, conversation, tokenize=False, add_generation_prompt=False, return_dict=False,
                            **kwargs):
        batch = bool(conversation) and isinstance(conversation[0], (list, tuple))
        texts = [self._render(list(c), add_generation_prompt, **kwargs) for c in (conversation if batch else
                                                                                  [conversation])]
        if not tokenize:
            return texts if batch else texts[0]
        ids = [[len(w) for w in t.split()] for t in texts]
        return {"input_ids": ids if batch else ids[0]} if return_dict else (ids if batch else ids[0])

    def __call__(self, text, add_special_tokens=True):
        """Plain text, one token per word (the reference-length check calls the tokenizer this way)."""
        return {"input_ids": [len(w) for w in text.split()]}


def _rows(n, prefix="q"):
    return [{"question": f"{prefix} {i}?", "answer": str(i)} for i in range(n)]


def _broken():
    """data/custom_broken.csv as notebook 01 loads it."""
    from datasets import load_dataset

    ds = load_dataset("csv", data_files=str(BROKEN_CSV), split="train")
    return ds.rename_columns({"problem": "question", "result": "answer"})


def _prepare(rows, tok=None, **kw):
    args = dict(train_rows=None, eval_rows=3, max_prompt_tokens=256, seed=0) | kw
    return D.prepare_dataset(rows, tok or WordTokenizer(), ARITHMETIC, **args)


# --------------------------------------------------------------------------- questions


def test_normalize_question():
    assert D.normalize_question("What is  2 + 3?") == D.normalize_question("what is 2 + 3")
    assert D.normalize_question("\uff37hat is 2 + 3!") == D.normalize_question("what is 2 + 3")  # NFKC
    assert D.normalize_question("What is 2 + 3?") != D.normalize_question("What is 2 + 4?")
    assert D.normalize_question(None) == "" and D.normalize_question(" ?! ") == ""


# --------------------------------------------------------------------------- validation


def test_validate_strict_names_row_field_and_fix():
    with pytest.raises(D.DataValidationError) as err:
        D.validate(_broken(), ARITHMETIC)
    msg = str(err.value)
    assert msg.startswith("4 problem(s) in 6 rows:")
    assert "row 1, field 'question': the question is empty (write it, or delete the row)" in msg
    assert "row 2, field 'answer': 'twelve' is not a number: write the answer as digits" in msg
    assert "row 3, field 'question': the same question as row 0 (delete one: prepare_dataset keeps the first" in msg
    assert "row 4, field 'answer': the answer is missing: write the final answer" in msg
    assert [p.kind for p in err.value.problems] == ["empty_question", "bad_answer", "duplicate", "bad_answer"]
    assert isinstance(err.value, D.DataError) and isinstance(err.value, ValueError)


def test_validate_lenient_returns_every_problem():
    problems = D.validate(_broken(), ARITHMETIC, strict=False)
    assert [(p.index, p.field, p.kind) for p in problems] == [
        (1, "question", "empty_question"), (2, "answer", "bad_answer"), (3, "question", "duplicate"),
        (4, "answer", "bad_answer")]
    assert all(isinstance(p, D.Problem) and p.message for p in problems)
    assert D.validate(_broken(), ARITHMETIC, strict=False, check_duplicates=False) == [
        problems[0], problems[1], problems[3]]


def test_validate_asks_the_task_what_a_right_answer_is():
    rows = [{"question": "Colour of the sky?", "answer": "blue"}]
    assert [p.kind for p in D.validate(rows, ARITHMETIC, strict=False)] == ["bad_answer"]  # a number task
    assert D.validate(rows, AnyAnswer()) == []  # the default: any text
    [missing] = D.validate([{"question": "Q", "answer": " "}], AnyAnswer(), strict=False)
    assert (missing.index, missing.field, missing.kind) == (0, "answer", "bad_answer")


def test_validate_reports_duplicates_with_the_first_row():
    rows = [{"question": "What is 2+3?", "answer": "5"}, {"question": "B", "answer": "1"},
            {"question": " what is 2+3 ", "answer": "5"}]
    [dup] = D.validate(rows, ARITHMETIC, strict=False)
    assert (dup.index, dup.field, dup.kind) == (2, "question", "duplicate")
    assert "the same question as row 0" in dup.message and "prepare_dataset keeps the first" in dup.message
    assert D.validate(rows, ARITHMETIC, check_duplicates=False) == []


def test_validate_missing_columns_and_datasets():
    import datasets

    [missing] = D.validate([{"text": "x", "answer": "1"}], ARITHMETIC, strict=False)
    assert (missing.index, missing.field, missing.kind) == (None, "question", "missing_column")
    assert str(missing).startswith("all rows, field 'question': there is no 'question' column (columns: ['text'")
    assert "rename_column('<yours>', 'question')" in missing.message
    both = D.validate([{"text": "x"}], ARITHMETIC, strict=False)
    assert [p.field for p in both] == ["question", "answer"]  # no row is read without its columns
    assert D.validate(datasets.Dataset.from_dict({"question": [], "answer": []}), ARITHMETIC) == []
    assert D.validate(datasets.Dataset.from_list(_rows(3)), ARITHMETIC) == []
    with pytest.raises(D.DataValidationError, match="no 'answer' column"):
        D.validate(datasets.Dataset.from_dict({"question": ["q"]}), ARITHMETIC)  # a Dataset's own column names


def test_validation_error_lists_five_problems_and_counts_the_rest():
    with pytest.raises(D.DataValidationError) as err:
        D.validate([{"question": f"Q{i}", "answer": "x"} for i in range(8)], ARITHMETIC)
    lines = str(err.value).splitlines()
    assert lines[0] == "8 problem(s) in 8 rows:" and len(lines) == 7
    assert lines[-1].startswith("  ... and 3 more: validate(rows, task, strict=False)")
    assert len(err.value.problems) == 8


def test_dedupe_keeps_first_and_reports_removed():
    import datasets

    rows = [{"question": "What is 2+3?"}, {"question": "what is 2+3"}, {"question": "B"}, {"question": "b."}]
    kept, removed = D.dedupe(rows)
    assert [r["question"] for r in kept] == ["What is 2+3?", "B"] and removed == [1, 3]
    kept, removed = D.dedupe(datasets.Dataset.from_list(rows))
    assert len(kept) == 2 and removed == [1, 3]


# --------------------------------------------------------------------------- tokens


def test_count_prompt_tokens_renders_as_trl_does():
    tok = WordTokenizer()
    prompts = [build_prompt("What is 2 + 3?", SYSTEM_PROMPT), build_prompt("What is 2 + 3? " * 20, SYSTEM_PROMPT)]
    counts = D.count_prompt_tokens(prompts, tok)
    assert counts == [len(ids) for ids in encode(tok, prompts)] and counts[1] == counts[0] + 19 * 5
    assert D.count_prompt_tokens(prompts[:1], tok, enable_thinking=False) == [counts[0] + 1]  # template kwargs
    assert D.count_prompt_tokens([], tok) == []


def test_length_stats():
    stats = D.length_stats([10, 20, 30, 40, 1000])
    assert stats == {"n": 5, "mean": 220.0, "min": 10.0, "p50": 30.0, "p90": 616.0, "p95": 808.0,
                     "p99": 961.6, "max": 1000.0}
    assert D.length_stats([]) == {"n": 0}
    assert D.length_stats((7,))["p99"] == 7.0


# --------------------------------------------------------------------------- split


def test_split_is_seeded_and_disjoint():
    a, info = D.split_train_eval(_rows(50), eval_rows=10, seed=1)
    b, _ = D.split_train_eval(_rows(50), eval_rows=10, seed=1)
    c, _ = D.split_train_eval(_rows(50), eval_rows=10, seed=2)
    assert a["eval"]["question"] == b["eval"]["question"] != c["eval"]["question"]
    assert not set(a["train"]["question"]) & set(a["eval"]["question"])
    assert info == {"train": 40, "eval": 10, "leaked_removed": 0}
    assert a["train"].column_names == ["question", "answer"]
    capped, info = D.split_train_eval(_rows(50), eval_rows=10, seed=1, train_rows=5)
    assert capped["train"]["question"] == a["train"]["question"][:5] and info["train"] == 5


def test_split_refuses_duplicates_and_too_few_rows():
    with pytest.raises(D.DataError, match=r"rows holds 1 duplicate question\(s\).*dedupe\(rows\)"):
        D.split_train_eval(_rows(5) + [{"question": "Q 0", "answer": "0"}], eval_rows=2, seed=0)
    with pytest.raises(D.DataError, match="Only 3 rows: too few for 3 eval rows"):
        D.split_train_eval(_rows(3), eval_rows=3, seed=0)
    with pytest.raises(D.DataError, match="at least 1"):
        D.split_train_eval(_rows(3), eval_rows=0, seed=0)
    with pytest.raises(D.DataError, match="eval_source holds 2 duplicate"):
        D.split_train_eval(_rows(5), eval_rows=1, seed=0, eval_source=_rows(2) * 2)
    with pytest.raises(D.DataError, match="eval_source is empty"):
        D.split_train_eval(_rows(5), eval_rows=1, seed=0, eval_source=[])


def test_split_from_an_eval_source_removes_leaked_train_rows():
    test = _rows(3, prefix="other") + [{"question": "Q 5", "answer": "5"}]
    splits, info = D.split_train_eval(_rows(20), eval_rows=4, seed=0, eval_source=test)
    assert sorted(splits["eval"]["question"]) == sorted(r["question"] for r in test)
    assert "q 5?" not in splits["train"]["question"]
    assert info == {"train": 19, "eval": 4, "leaked_removed": 1}
    fewer, _ = D.split_train_eval(_rows(20), eval_rows=2, seed=0, eval_source=test)
    assert fewer["eval"].num_rows == 2  # a sample of the held-out split


# --------------------------------------------------------------------------- prepare_dataset


def test_prepare_dataset_counts_every_removed_row():
    rows = (_rows(30) + [{"question": "  Q 3 ", "answer": "3"}, {"question": "q 7", "answer": "7"}]  # 2 duplicates
            + [{"question": "", "answer": "1"}, {"question": "Q x", "answer": "many"}]  # 2 invalid
            + [{"question": "word " * 400, "answer": "1"}])  # 1 over budget
    test = _rows(4, prefix="other") + [{"question": "q 11", "answer": "11"}]  # 1 leaked into eval
    splits, card = _prepare(rows, eval_rows=5, max_prompt_tokens=100, eval_source=test, strict=False,
                            source={"task": "test"})
    assert card["counts"]["rows"] == {"loaded": 35, "invalid_removed": 2, "duplicates_removed": 2,
                                      "over_budget_removed": 1, "kept": 30}
    assert card["counts"]["eval_source"] == {"loaded": 5, "invalid_removed": 0, "duplicates_removed": 0,
                                             "over_budget_removed": 0, "kept": 5}
    assert (card["counts"]["train"], card["counts"]["eval"], card["counts"]["leaked_removed"]) == (29, 5, 1)
    assert (splits["train"].num_rows, splits["eval"].num_rows) == (29, 5)
    train = {D.normalize_question(q) for q in splits["train"]["question"]}
    assert not train & {D.normalize_question(q) for q in splits["eval"]["question"]}
    assert card["source"] == {"task": "test"} and card["seed"] == 0
    assert card["filters"] == {"max_prompt_tokens": 100, "dedupe": "normalize_question", "invalid_rows": "drop"}
    assert card["token_lengths"]["n"] == 31 + 5 and card["token_lengths"]["max"] > 400
    assert card["system_role"] is True and set(card["columns"]) == {"question", "answer", "prompt", "prompt_tokens"}
    assert set(card) == {"source", "seed", "counts", "filters", "token_lengths", "system_role", "columns", "created",
                         "seconds"}
    assert json.loads(json.dumps(card)) == card


def test_prepare_dataset_builds_the_tasks_prompts_and_cleans_answers():
    rows = [{"question": f"What is {i} + 1?", "answer": f"${i + 1:,}", "unit": "dollars"} for i in range(1000, 1012)]
    rows.append({"question": "GSM8K style?", "answer": "1 + 1 = <<1+1=2>>2\n#### 2", "unit": "none"})
    splits, card = _prepare(rows, train_rows=8, seed=1)
    row = splits["train"][0]
    assert row["prompt"] == build_prompt(row["question"], SYSTEM_PROMPT) and row["unit"]  # columns reach the rewards
    assert row["prompt_tokens"] == D.count_prompt_tokens([row["prompt"]], WordTokenizer())[0]
    answers = list(splits["train"]["answer"]) + list(splits["eval"]["answer"])
    assert all(re.fullmatch(r"\d+", a) for a in answers) and len(answers) == 11
    assert card["counts"]["train"] == 8 and card["filters"]["invalid_rows"] == "raise"
    assert card["source"] == {"task": "arithmetic"}  # the default source names the task


def test_prepare_dataset_asks_the_task_for_each_rows_system_prompt():
    rows = [{"question": f"Ava ordered {i} pens.", "answer": json.dumps({"quantity": i}),
             "schema": json.dumps({"type": "object", "properties": {"quantity": {"type": "integer"}}})}
            for i in range(1, 7)]
    splits, _ = D.prepare_dataset(rows, WordTokenizer(), get_task("json"), train_rows=None, eval_rows=2,
                                  max_prompt_tokens=256, seed=0)
    row = splits["train"][0]
    assert row["prompt"][0] == {"role": "system", "content": get_task("json").system_prompt_for(row)}
    assert "quantity (integer)" in row["prompt"][0]["content"] and "schema" in splits["train"].column_names


def test_prepare_dataset_strict_raises_and_a_missing_column_always_raises():
    with pytest.raises(D.DataValidationError, match="row 2, field 'answer'"):
        _prepare(_broken(), eval_rows=1)
    splits, card = _prepare(_broken(), eval_rows=1, strict=False)
    assert card["counts"]["rows"] == {"loaded": 6, "invalid_removed": 3, "duplicates_removed": 1,
                                      "over_budget_removed": 0, "kept": 2}
    assert "unit" in splits["train"].column_names
    with pytest.raises(D.DataValidationError, match="no 'answer' column"):
        _prepare([{"question": "Q", "result": "1"}] * 3, eval_rows=1, strict=False)


def test_prepare_dataset_folds_the_system_prompt_for_a_template_without_it():
    splits, card = _prepare(_rows(6), WordTokenizer(system_role=False), eval_rows=2)
    prompt = splits["train"][0]["prompt"]
    assert [m["role"] for m in prompt] == ["user"] and prompt[0]["content"].startswith(SYSTEM_PROMPT + "\n\n")
    assert card["system_role"] is False


def test_prepare_dataset_passes_chat_template_kwargs():
    _, plain = _prepare(_rows(6), eval_rows=2)
    _, off = _prepare(_rows(6), eval_rows=2, chat_template_kwargs={"enable_thinking": False})
    assert off["token_lengths"]["mean"] == plain["token_lengths"]["mean"] + 1


# --------------------------------------------------------------------------- save, load


def test_save_and_load_round_trip_with_card(tmp_path):
    splits, card = _prepare(_rows(12))
    path = D.save_prepared(splits, tmp_path / "dataset", card)
    back = D.load_prepared(path)
    assert list(back) == ["train", "eval"] and back["eval"]["question"] == splits["eval"]["question"]
    assert back["train"][0]["prompt"][0]["role"] == "system"
    assert D.read_card(path) == json.loads(json.dumps(card))
    D.save_prepared(splits, path, {"seed": 1})  # replaces what was there
    assert D.read_card(path) == {"seed": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["dataset"]  # no temporary folders left
    assert D.read_card(tmp_path) == {}


def test_save_and_load_errors_say_how_to_rebuild(tmp_path):
    import datasets

    splits, card = _prepare(_rows(12))
    with pytest.raises(D.DataError, match=r"ensure_prepared\(PROFILE, RUN\)"):
        D.load_prepared(tmp_path / "nothing")
    with pytest.raises(D.DataError, match=r"needs 'train' and 'eval' splits \(has \['train'\]\)"):
        D.save_prepared(datasets.DatasetDict({"train": splits["train"]}), tmp_path / "x", card)
    assert not (tmp_path / "x").exists()
    datasets.DatasetDict({"train": splits["train"]}).save_to_disk(str(tmp_path / "one"))
    with pytest.raises(D.DataError, match="lacks the 'eval' split"):
        D.load_prepared(tmp_path / "one")
    datasets.DatasetDict({"test": splits["eval"]}).save_to_disk(str(tmp_path / "test-only"))
    with pytest.raises(D.DataError, match="lacks the 'train' split"):
        D.load_prepared(tmp_path / "test-only")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows(3)),
                          "eval": datasets.Dataset.from_list(_rows(2))}).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(D.DataError, match=r"lacks the 'train' split or its columns \['prompt'\]"):
        D.load_prepared(tmp_path / "two")


# --------------------------------------------------------------------------- ensure_prepared


def test_ensure_prepared_builds_loads_and_rebuilds_on_new_settings(tmp_path, capsys):
    smoke, tok = get_profile("cpu-smoke"), WordTokenizer()
    ds = D.ensure_prepared(smoke, tmp_path, tokenizer=tok)
    assert (ds["train"].num_rows, ds["eval"].num_rows) == (smoke.train_rows, smoke.eval_rows)
    row = ds["train"][0]
    assert row["prompt"][-1]["role"] == "user" and row["level"] == smoke.task_level
    assert normalize_number(row["answer"]) == row["answer"] and row["solution"]
    every = generate_arithmetic(smoke.train_rows + smoke.eval_rows, smoke.task_level, smoke.split_seed)
    assert {r["question"] for r in every} == set(ds["train"]["question"]) | set(ds["eval"]["question"])
    card = D.read_card(tmp_path / "dataset")
    assert card["origin"] == "ensure_prepared" and card["spec"]["task_level"] == smoke.task_level
    assert card["spec"]["task"] == "arithmetic" and card["spec"]["model"] == smoke.model
    assert card["source"] == {"task": "arithmetic", "level": smoke.task_level}
    assert f"{smoke.train_rows} train, {smoke.eval_rows} eval rows" in capsys.readouterr().out

    stamp = (tmp_path / "dataset" / D.CARD).stat().st_mtime_ns
    again = D.ensure_prepared(smoke, tmp_path, verbose=False)  # same settings: loaded, no tokenizer needed
    assert again["eval"]["question"] == ds["eval"]["question"]
    assert (tmp_path / "dataset" / D.CARD).stat().st_mtime_ns == stamp

    bigger = smoke.with_overrides(train_rows=20, eval_rows=5, eval_prompts=5, task_level="add3")
    ds3 = D.ensure_prepared(bigger, tmp_path, tokenizer=tok)
    out = capsys.readouterr().out
    assert "Rebuilding" in out and "(eval_rows, task_level, train_rows)" in out
    assert ds3["train"].num_rows == 20 and ds3["train"][0]["level"] == "add3"

    stamp = (tmp_path / "dataset" / D.CARD).stat().st_mtime_ns
    D.ensure_prepared(bigger, tmp_path, tokenizer=tok, rebuild=True, verbose=False)
    assert (tmp_path / "dataset" / D.CARD).stat().st_mtime_ns != stamp


def test_another_seed_is_scored_on_the_same_held_out_rows_and_split_seed_draws_new_ones(tmp_path):
    demo, tok = get_profile("cpu-demo"), WordTokenizer()
    first = D.ensure_prepared(demo, tmp_path / "a", tokenizer=tok, verbose=False)
    other_seed = D.ensure_prepared(demo.with_overrides(seed=1), tmp_path / "b", tokenizer=tok, verbose=False)
    assert other_seed["eval"]["question"] == first["eval"]["question"]
    assert other_seed["train"]["question"] == first["train"]["question"]  # TRL's sampler, seeded by seed, orders them
    other_split = D.ensure_prepared(demo.with_overrides(split_seed=1), tmp_path / "c", tokenizer=tok, verbose=False)
    assert len(set(other_split["eval"]["question"]) & set(first["eval"]["question"])) < demo.eval_rows // 2
    assert not set(other_split["eval"]["question"]) & set(other_split["train"]["question"])
    assert D.read_card(tmp_path / "c" / "dataset")["spec"]["split_seed"] == 1


def test_ensure_prepared_rebuilds_for_another_task(tmp_path, capsys):
    D.ensure_prepared(get_profile("cpu-smoke"), tmp_path, tokenizer=WordTokenizer(), verbose=False)
    ds = D.ensure_prepared(get_profile("cpu-smoke", task="json"), tmp_path, tokenizer=WordTokenizer())
    assert "Rebuilding" in capsys.readouterr().out
    assert ds["train"][0]["level"] == "orders" and "schema" in ds["train"].column_names


def test_ensure_prepared_keeps_a_dataset_you_saved_yourself(tmp_path):
    splits, card = _prepare(_rows(12))
    D.save_prepared(splits, tmp_path / "dataset", dict(card, source={"task": "custom"}))
    ds = D.ensure_prepared(get_profile("cpu-smoke"), tmp_path)  # other settings, but no origin: kept
    assert ds["train"].num_rows == 9


def test_ensure_prepared_gsm8k_from_local_files_evaluates_on_the_test_split(tmp_path, monkeypatch):
    monkeypatch.setenv(GSM8K_DIR_ENV, str(SAMPLE))
    profile = get_profile("colab-t4", model="smollm2-135m", train_rows=20, eval_rows=4, eval_prompts=4)
    ds = D.ensure_prepared(profile, tmp_path, tokenizer=WordTokenizer(), verbose=False)
    test_qs = {json.loads(line)["question"] for line in (SAMPLE / "test.jsonl").open()}
    assert set(ds["eval"]["question"]) <= test_qs and ds["eval"].num_rows == 4
    assert ds["train"].num_rows == 20 and not set(ds["train"]["question"]) & test_qs
    card = D.read_card(tmp_path / "dataset")
    assert card["source"] == {"task": "arithmetic", "level": "gsm8k"}
    assert card["counts"]["eval_source"]["loaded"] == 10 and card["counts"]["rows"]["loaded"] == 30


# --------------------------------------------------------------------------- with the bundled tokenizer (slow)


@pytest.fixture(scope="module")
def tok():
    """The cpu-smoke tokenizer as the notebooks have it: prepared, the prefill installed."""
    from helpers.models import load_tokenizer

    return load_tokenizer(get_profile("cpu-smoke"))


@pytest.mark.slow
def test_count_prompt_tokens_is_what_trl_feeds(tok):
    import copy

    from helpers.prompts import install_prefill

    prompts = [build_prompt("What is 2 + 3?", SYSTEM_PROMPT), build_prompt("What is 2 + 3? " * 20, SYSTEM_PROMPT)]
    counts = D.count_prompt_tokens(prompts, tok)
    want = tok.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert counts == [len(ids) for ids in want] and counts[1] > counts[0] + 40
    plain = install_prefill(copy.deepcopy(tok), "")
    assert D.count_prompt_tokens(prompts[:1], plain)[0] == counts[0] - len(tok(PREFILL, add_special_tokens=False)
                                                                           ["input_ids"])


@pytest.mark.slow
def test_ensure_prepared_loads_the_profiles_tokenizer_when_none_is_given(tmp_path, tok):
    small = dict(train_rows=6, eval_rows=2, eval_prompts=2)
    ds = D.ensure_prepared(get_profile("cpu-smoke", **small), tmp_path, verbose=False)
    assert ds["train"].num_rows == 6
    row = ds["train"][0]
    assert row["prompt_tokens"] == D.count_prompt_tokens([row["prompt"]], tok)[0]  # the prefill included
    json_ds = D.ensure_prepared(get_profile("cpu-smoke", task="json", **small), tmp_path / "j", verbose=False)
    from helpers.models import load_tokenizer

    json_tok = load_tokenizer(get_profile("cpu-smoke", task="json"))
    row = json_ds["train"][0]
    assert row["prompt_tokens"] == D.count_prompt_tokens([row["prompt"]], json_tok)[0]  # with the JSON prefill
    assert json_tok.decode(encode(json_tok, [row["prompt"]])[0]).endswith('assistant\n{"')
