"""helpers.data: answers, validation, dedupe, token counts, the split, prepare/save/load, ensure_prepared."""

from __future__ import annotations

import copy
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from helpers import data as D
from helpers.config import get_profile, project_root
from helpers.prompts import PREFILL, SYSTEM_PROMPT, build_prompt, encode, install_prefill

ROOT = project_root() or Path(__file__).resolve().parents[1]
REAL_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
SAMPLE = ROOT / "data" / "gsm8k_sample"
BROKEN_CSV = ROOT / "data" / "custom_broken.csv"
GEMMA_LIKE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


@pytest.fixture(scope="module")
def tok():
    """The cpu-smoke tokenizer as the notebooks have it: prepared, the prefill installed."""
    from helpers.models import load_tokenizer

    return load_tokenizer(get_profile("cpu-smoke"))


def _rows(n, prefix="q"):
    return [{"question": f"{prefix} {i}?", "answer": str(i)} for i in range(n)]


def _broken():
    """data/custom_broken.csv as notebook 01 loads it."""
    from datasets import load_dataset

    ds = load_dataset("csv", data_files=str(BROKEN_CSV), split="train")
    return ds.rename_columns({"problem": "question", "result": "answer"})


# --------------------------------------------------------------------------- answers and questions


@pytest.mark.parametrize("text, expected", [
    ("Half of 48 is 24.\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("#### $18", "18"),
    ("#### -5", "-5"),
    ("a #### 3 then b\n#### 4", "4"),  # the last marker wins
    ("####    10.50  ", "10.5"),
    ("#### twelve", "twelve"),  # returned as text so validate() can name it
    ("no marker here 5", None),
    ("", None),
    (None, None),
    (72, None),
])
def test_extract_hash_answer(text, expected):
    assert D.extract_hash_answer(text) == expected


@pytest.mark.parametrize("value, expected", [
    (" $1,200 ", "1200"), (1200, "1200"), (3.50, "3.5"), ("so 2 + 2 = 4\n#### 4", "4"), ("blue", "blue"),
    ("  ", None), (None, None), ("", None),
    ("so the answer is\n#### ", None),  # a marker with nothing after it is a missing answer
])
def test_clean_answer(value, expected):
    assert D.clean_answer(value) == expected


def test_solution_text_and_normalize_question():
    assert D.solution_text("a = <<1+2=3>>3\nb\n#### 3") == "a = 3\nb"
    assert D.solution_text("no marker <<2*3=6>>6") == "no marker 6"
    assert D.normalize_question("What is  2 + 3?") == D.normalize_question("what is 2 + 3")
    assert D.normalize_question("\uff37hat is 2 + 3!") == D.normalize_question("what is 2 + 3")  # NFKC
    assert D.normalize_question("What is 2 + 3?") != D.normalize_question("What is 2 + 4?")
    assert D.normalize_question(None) == ""


@pytest.mark.skipif(not REAL_GSM8K.is_dir(), reason="the real GSM8K files are not on this machine")
@pytest.mark.parametrize("split, n", [("train", 7473), ("test", 1319)])
def test_every_real_gsm8k_answer_parses_to_a_number(split, n):
    rows = [json.loads(line) for line in (REAL_GSM8K / f"{split}.jsonl").open()]
    assert len(rows) == n
    bad = [i for i, r in enumerate(rows) if D.normalize_number(D.extract_hash_answer(r["answer"])) is None]
    assert bad == []
    assert D.validate(rows) == []  # strict: no problem at all, duplicates included
    assert all(D.solution_text(r["answer"]) and "<<" not in D.solution_text(r["answer"]) for r in rows)


def _calc(expr: str) -> Fraction:
    return eval(re.sub(r"(\d+(?:\.\d+)?)", r"Fraction('\1')", expr), {"Fraction": Fraction})


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_authored_gsm8k_sample_is_gsm8k_shaped_and_its_arithmetic_is_right(split):
    rows = [json.loads(line) for line in (SAMPLE / f"{split}.jsonl").open()]
    assert len(rows) >= 10 and D.validate(rows) == []
    for r in rows:
        assert set(r) == {"question", "answer"}
        notes = re.findall(r"<<([^=>]+)=([^>]+)>>", r["answer"])
        assert notes, r["question"]
        for expr, value in notes:
            assert _calc(expr) == Fraction(value), (expr, value)


# --------------------------------------------------------------------------- validation


def test_validate_strict_names_row_field_and_fix():
    with pytest.raises(D.DataValidationError) as err:
        D.validate(_broken())
    msg = str(err.value)
    assert msg.startswith("4 problem(s) in 6 rows:")
    assert "row 1, field 'question': the question is empty. Fix: write the question text" in msg
    assert "row 2, field 'answer': 'twelve' is not a number. Fix: write the answer as digits" in msg
    assert "row 3, field 'question': same question as row 0" in msg
    assert "row 4, field 'answer': the answer is missing. Fix:" in msg
    assert [p.kind for p in err.value.problems] == ["empty_question", "not_a_number", "duplicate", "missing_answer"]
    assert isinstance(err.value, D.DataError) and isinstance(err.value, ValueError)


def test_validate_lenient_returns_every_problem():
    problems = D.validate(_broken(), strict=False)
    assert [(p.index, p.field, p.kind) for p in problems] == [
        (1, "question", "empty_question"), (2, "answer", "not_a_number"), (3, "question", "duplicate"),
        (4, "answer", "missing_answer")]
    assert all(isinstance(p, D.Problem) and p.message and p.fix for p in problems)
    assert D.validate(_broken(), strict=False, check_duplicates=False, numeric_answer=False) == [
        problems[0], problems[3]]


def test_validate_reports_duplicates_with_the_first_row():
    rows = [{"question": "What is 2+3?", "answer": "5"}, {"question": "B", "answer": "1"},
            {"question": " what is 2+3 ", "answer": "5"}]
    [dup] = D.validate(rows, strict=False)
    assert (dup.index, dup.field, dup.kind) == (2, "question", "duplicate")
    assert "same question as row 0" in dup.message and "prepare_dataset keeps the first" in dup.fix
    assert D.validate(rows, check_duplicates=False) == []


def test_validate_options_and_missing_columns():
    import datasets

    rows = [{"question": "Colour of the sky?", "answer": "blue"}]
    assert D.validate(rows, numeric_answer=False) == []
    assert [p.kind for p in D.validate(rows, strict=False)] == ["not_a_number"]
    assert [p.kind for p in D.validate([{"question": "Q", "answer": "#### "}], strict=False,
                                       numeric_answer=False)] == ["missing_answer"]
    [missing] = D.validate([{"text": "x", "answer": "1"}], strict=False)
    assert (missing.index, missing.field, missing.kind) == (None, "question", "missing_column")
    assert str(missing).startswith("all rows, field 'question': there is no 'question' column (columns: ['text'")
    assert "rename_column" in missing.fix
    assert D.validate(datasets.Dataset.from_dict({"question": [], "answer": []})) == []
    assert D.validate(datasets.Dataset.from_list(_rows(3))) == []


def test_validation_error_lists_five_problems_and_counts_the_rest():
    with pytest.raises(D.DataValidationError) as err:
        D.validate([{"question": f"Q{i}", "answer": "x"} for i in range(8)])
    lines = str(err.value).splitlines()
    assert lines[0] == "8 problem(s) in 8 rows:" and len(lines) == 7
    assert lines[-1].startswith("  ... and 3 more: validate(rows, strict=False)")
    assert len(err.value.problems) == 8


def test_dedupe_keeps_first_and_reports_removed():
    import datasets

    rows = [{"question": "What is 2+3?"}, {"question": "what is 2+3"}, {"question": "B"}, {"question": "b."}]
    kept, removed = D.dedupe(rows)
    assert [r["question"] for r in kept] == ["What is 2+3?", "B"] and removed == [1, 3]
    kept, removed = D.dedupe(datasets.Dataset.from_list(rows))
    assert len(kept) == 2 and removed == [1, 3]


# --------------------------------------------------------------------------- tokens


def test_count_prompt_tokens_is_what_trl_feeds(tok):
    prompts = [build_prompt("What is 2 + 3?"), build_prompt("What is 2 + 3? " * 20)]
    counts = D.count_prompt_tokens(prompts, tok)
    assert counts == [len(ids) for ids in encode(tok, prompts)]
    assert counts[1] > counts[0] + 40
    plain = install_prefill(copy.deepcopy(tok), "")
    assert D.count_prompt_tokens(prompts[:1], plain)[0] == counts[0] - len(tok(PREFILL, add_special_tokens=False)
                                                                           ["input_ids"])
    assert D.count_prompt_tokens([], tok) == []


def test_length_stats():
    stats = D.length_stats([10, 20, 30, 40, 1000])
    assert stats == {"n": 5, "mean": 220.0, "min": 10.0, "p50": 30.0, "p90": 616.0, "p95": 808.0,
                     "p99": 961.6, "max": 1000.0}
    assert D.length_stats([]) == {"n": 0}


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


# --------------------------------------------------------------------------- prepare_dataset


def test_prepare_dataset_counts_every_removed_row(tok):
    rows = (_rows(30) + [{"question": "  Q 3 ", "answer": "3"}, {"question": "q 7", "answer": "7"}]  # 2 duplicates
            + [{"question": "", "answer": "1"}, {"question": "Q x", "answer": "many"}]  # 2 invalid
            + [{"question": "word " * 400, "answer": "1"}])  # 1 over budget
    test = _rows(4, prefix="other") + [{"question": "q 11", "answer": "11"}]  # 1 leaked into eval
    splits, card = D.prepare_dataset(rows, tok, train_rows=None, eval_rows=5, max_prompt_tokens=100, seed=0,
                                     eval_source=test, strict=False, source={"task": "test"})
    assert card["counts"]["rows"] == {"loaded": 35, "invalid_removed": 2, "duplicates_removed": 2,
                                      "over_budget_removed": 1, "kept": 30}
    assert card["counts"]["eval_source"] == {"loaded": 5, "invalid_removed": 0, "duplicates_removed": 0,
                                             "over_budget_removed": 0, "kept": 5}
    assert (card["counts"]["train"], card["counts"]["eval"], card["counts"]["leaked_removed"]) == (29, 5, 1)
    assert (splits["train"].num_rows, splits["eval"].num_rows) == (29, 5)
    train = {D.normalize_question(q) for q in splits["train"]["question"]}
    assert not train & {D.normalize_question(q) for q in splits["eval"]["question"]}
    assert card["source"] == {"task": "test"} and card["seed"] == 0
    assert card["filters"] == {"max_prompt_tokens": 100, "dedupe": "normalize_question", "invalid_rows": "drop",
                               "tokenizer": "SmolLM2-135M-Instruct"}
    assert card["token_lengths"]["n"] == 31 + 5 and card["token_lengths"]["max"] > 400
    assert card["format"]["system_role"] is True and card["format"]["system_prompt"] == SYSTEM_PROMPT
    assert set(card["format"]["columns"]) == {"question", "answer", "prompt", "prompt_tokens"}


def test_prepare_dataset_builds_prompts_and_normalises_answers(tok):
    rows = [{"question": f"What is {i} + 1?", "answer": f"${i + 1:,}", "unit": "dollars"} for i in range(1000, 1012)]
    rows.append({"question": "GSM8K style?", "answer": "1 + 1 = <<1+1=2>>2\n#### 2", "unit": "none"})
    splits, card = D.prepare_dataset(rows, tok, train_rows=8, eval_rows=3, max_prompt_tokens=256, seed=1)
    row = splits["train"][0]
    assert row["prompt"] == build_prompt(row["question"]) and row["unit"]  # extra columns reach the rewards
    assert row["prompt_tokens"] == D.count_prompt_tokens([row["prompt"]], tok)[0]
    answers = list(splits["train"]["answer"]) + list(splits["eval"]["answer"])
    assert all(re.fullmatch(r"\d+", a) for a in answers) and len(answers) == 11
    assert card["counts"]["train"] == 8 and card["filters"]["invalid_rows"] == "raise"


def test_prepare_dataset_strict_raises_and_a_missing_column_always_raises(tok):
    with pytest.raises(D.DataValidationError, match="row 2, field 'answer'"):
        D.prepare_dataset(_broken(), tok, train_rows=None, eval_rows=1, max_prompt_tokens=256, seed=0)
    splits, card = D.prepare_dataset(_broken(), tok, train_rows=None, eval_rows=1, max_prompt_tokens=256, seed=0,
                                     strict=False)
    assert card["counts"]["rows"] == {"loaded": 6, "invalid_removed": 3, "duplicates_removed": 1,
                                      "over_budget_removed": 0, "kept": 2}
    assert "unit" in splits["train"].column_names
    with pytest.raises(D.DataValidationError, match="no 'answer' column"):
        D.prepare_dataset([{"question": "Q", "result": "1"}] * 3, tok, train_rows=None, eval_rows=1,
                          max_prompt_tokens=256, seed=0, strict=False)


def test_prepare_dataset_folds_the_system_prompt_for_a_template_without_it(tok):
    gemma = copy.deepcopy(tok)
    gemma.chat_template = GEMMA_LIKE
    splits, card = D.prepare_dataset(_rows(6), gemma, train_rows=None, eval_rows=2, max_prompt_tokens=256, seed=0)
    prompt = splits["train"][0]["prompt"]
    assert [m["role"] for m in prompt] == ["user"] and prompt[0]["content"].startswith(SYSTEM_PROMPT + "\n\n")
    assert card["format"]["system_role"] is False


def test_prepare_dataset_passes_chat_template_kwargs(tok):
    thinking = copy.deepcopy(tok)
    thinking.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                              "{% if enable_thinking is defined and not enable_thinking %} no thinking{% endif %}")
    args = dict(train_rows=None, eval_rows=2, max_prompt_tokens=256, seed=0)
    _, plain = D.prepare_dataset(_rows(6), thinking, **args)
    _, off = D.prepare_dataset(_rows(6), thinking, chat_template_kwargs={"enable_thinking": False}, **args)
    assert off["token_lengths"]["mean"] > plain["token_lengths"]["mean"]


# --------------------------------------------------------------------------- save, load, ensure_prepared


def _prepared(tok, n=12):
    return D.prepare_dataset(_rows(n), tok, train_rows=None, eval_rows=3, max_prompt_tokens=256, seed=0)


def test_save_and_load_round_trip_with_card(tmp_path, tok):
    splits, card = _prepared(tok)
    path = D.save_prepared(splits, tmp_path / "dataset", card)
    back = D.load_prepared(path)
    assert list(back) == ["train", "eval"] and back["eval"]["question"] == splits["eval"]["question"]
    assert back["train"][0]["prompt"][0]["role"] == "system"
    assert D.read_card(path) == json.loads(json.dumps(card))
    D.save_prepared(splits, path, {"seed": 1})  # replaces what was there
    assert D.read_card(path) == {"seed": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["dataset"]  # no temporary folders left
    assert D.read_card(tmp_path) == {}


def test_save_and_load_errors_say_how_to_rebuild(tmp_path, tok):
    import datasets

    splits, card = _prepared(tok)
    with pytest.raises(D.DataError, match="ensure_prepared"):
        D.load_prepared(tmp_path / "nothing")
    with pytest.raises(D.DataError, match="needs a 'eval' split"):
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


def test_ensure_prepared_builds_loads_and_rebuilds_on_new_settings(tmp_path, tok, capsys):
    smoke = get_profile("cpu-smoke")
    ds = D.ensure_prepared(smoke, tmp_path, tokenizer=tok)
    assert (ds["train"].num_rows, ds["eval"].num_rows) == (smoke.train_rows, smoke.eval_rows)
    row = ds["train"][0]
    assert row["prompt"][-1]["role"] == "user" and row["level"] == smoke.task_level
    assert D.normalize_number(row["answer"]) == row["answer"]
    card = D.read_card(tmp_path / "dataset")
    assert card["origin"] == "ensure_prepared" and card["spec"]["task_level"] == smoke.task_level
    assert card["source"] == {"task": "arithmetic", "level": smoke.task_level, "seed": smoke.seed}
    assert f"{smoke.train_rows} train, {smoke.eval_rows} eval rows" in capsys.readouterr().out

    stamp = (tmp_path / "dataset" / D.CARD_NAME).stat().st_mtime_ns
    again = D.ensure_prepared(smoke, tmp_path, verbose=False)  # same settings: loaded, no tokenizer needed
    assert again["eval"]["question"] == ds["eval"]["question"]
    assert (tmp_path / "dataset" / D.CARD_NAME).stat().st_mtime_ns == stamp

    bigger = smoke.with_overrides(train_rows=20, eval_rows=5, task_level="add3")
    ds3 = D.ensure_prepared(bigger, tmp_path, tokenizer=tok)
    out = capsys.readouterr().out
    assert "Rebuilding" in out and "(eval_rows, task_level, train_rows)" in out
    assert ds3["train"].num_rows == 20 and ds3["train"][0]["level"] == "add3"

    stamp = (tmp_path / "dataset" / D.CARD_NAME).stat().st_mtime_ns
    D.ensure_prepared(bigger, tmp_path, tokenizer=tok, rebuild=True, verbose=False)
    assert (tmp_path / "dataset" / D.CARD_NAME).stat().st_mtime_ns != stamp


def test_ensure_prepared_keeps_a_dataset_you_saved_yourself(tmp_path, tok):
    splits, card = _prepared(tok)
    D.save_prepared(splits, tmp_path / "dataset", dict(card, source={"task": "custom"}))
    ds = D.ensure_prepared(get_profile("cpu-smoke"), tmp_path)  # other settings, but no origin: kept
    assert ds["train"].num_rows == 9


def test_ensure_prepared_gsm8k_from_local_files_evaluates_on_the_test_split(tmp_path, tok, monkeypatch):
    from helpers.tasks import GSM8K_DIR_ENV

    monkeypatch.setenv(GSM8K_DIR_ENV, str(SAMPLE))
    profile = get_profile("colab-t4", model="smollm2-135m", train_rows=20, eval_rows=4)
    ds = D.ensure_prepared(profile, tmp_path, tokenizer=tok, verbose=False)
    test_qs = {json.loads(line)["question"] for line in (SAMPLE / "test.jsonl").open()}
    assert set(ds["eval"]["question"]) <= test_qs and ds["eval"].num_rows == 4
    assert ds["train"].num_rows == 20 and not set(ds["train"]["question"]) & test_qs
    card = D.read_card(tmp_path / "dataset")
    assert card["source"] == {"task": "gsm8k", "eval_from": "test split"}
    assert card["counts"]["eval_source"]["loaded"] == 10 and card["counts"]["rows"]["loaded"] == 30


def test_ensure_prepared_loads_the_profiles_tokenizer_when_none_is_given(tmp_path, tok):
    ds = D.ensure_prepared(get_profile("cpu-smoke", train_rows=6, eval_rows=2), tmp_path, verbose=False)
    assert ds["train"].num_rows == 6
    row = ds["train"][0]
    assert row["prompt_tokens"] == D.count_prompt_tokens([row["prompt"]], tok)[0]  # prefill included
