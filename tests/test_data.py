"""helpers.data: answers, loading, validation, prompts, lengths, split, save, ensure_prepared."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import data as D
from helpers.config import get_profile, project_root
from helpers.prompts import REASONING_START, SYSTEM_PROMPT

ROOT = project_root() or Path(__file__).resolve().parents[1]
REAL_GSM8K = ROOT.parent / "shared" / "data" / "gsm8k"
SAMPLE = ROOT / "data" / "gsm8k_sample"


@pytest.fixture(scope="module")
def tok():
    from helpers.models import load_tokenizer

    return load_tokenizer()


# ------------------------------------------------------------------ answers


@pytest.mark.parametrize("text, expected", [
    ("1,234", "1234"), ("$18", "18"), ("-5", "-5"), ("18.00", "18"), ("3.50", "3.5"),
    ("12.", "12"), ("50%", "50"), (" 7 ", "7"), ("+7", "7"), ("-0", "0"), (".5", "0.5"),
    ("\u22123", "-3"), ("1,234,567.50", "1234567.5"), (42, "42"),
    ("ten", None), ("", None), (None, None), ("1,2", None), ("12,34", None), ("1e3", None),
    ("3/4", None), ("5 apples", None), ("1.2.3", None), (True, None), ("..", None), ("1 2", None),
])
def test_normalize_number(text, expected):
    assert D.normalize_number(text) == expected


@given(st.integers(min_value=-10**12, max_value=10**12))
def test_normalize_number_reads_grouped_integers(n):
    assert D.normalize_number(f"{n:,}") == str(n)
    assert D.normalize_number(f"${n}") == str(n)


@pytest.mark.parametrize("text, expected", [
    ("Half of 48 is 24.\n#### 72", "72"),
    ("#### 1,234", "1234"),
    ("#### $18", "18"),
    ("#### -5", "-5"),
    ("a #### 3 then b\n#### 4", "4"),  # the last marker wins
    ("####    10.50  ", "10.5"),
    ("no marker here 5", None),
    ("", None),
    (None, None),
    ("#### twelve", "twelve"),  # returned as text so validate() can name it
])
def test_extract_hash_answer(text, expected):
    assert D.extract_hash_answer(text) == expected


def test_clean_answer_and_solution_text():
    assert D.clean_answer(" $1,200 ") == "1200"
    assert D.clean_answer("so 2 + 2 = 4\n#### 4") == "4"
    assert D.clean_answer("  ") is None and D.clean_answer(None) is None
    assert D.clean_answer("blue") == "blue"
    assert D.solution_text("a = <<1+2=3>>3\nb\n#### 3") == "a = 3\nb"


def test_normalize_question_ignores_case_spacing_and_end_punctuation():
    assert D.normalize_question("What is  2 + 3?") == D.normalize_question("what is 2 + 3")
    assert D.normalize_question("What is 2 + 3?") != D.normalize_question("What is 2 + 4?")
    assert D.normalize_question(None) == ""


@pytest.mark.skipif(not REAL_GSM8K.is_dir(), reason="the real GSM8K files are not on this machine")
@pytest.mark.parametrize("split, n", [("train", 7473), ("test", 1319)])
def test_every_real_gsm8k_answer_parses_to_a_number(split, n):
    rows = [json.loads(line) for line in (REAL_GSM8K / f"{split}.jsonl").open()]
    assert len(rows) == n
    bad = [i for i, r in enumerate(rows) if D.normalize_number(D.extract_hash_answer(r["answer"])) is None]
    assert bad == []
    # and through the loader, the same code path as the hub
    parsed = D.parse_gsm8k(D.load_gsm8k(split, source=REAL_GSM8K))
    assert parsed.num_rows == n and None not in parsed["answer"]
    assert D.validate(parsed).ok


def _calc(expr: str) -> Fraction:
    py = re.sub(r"(\d+(?:\.\d+)?)", r"Fraction('\1')", expr)
    return eval(py, {"Fraction": Fraction})


@pytest.mark.parametrize("split", ["train", "test"])
def test_authored_sample_is_gsm8k_shaped_and_its_arithmetic_is_right(split):
    rows = [json.loads(line) for line in (SAMPLE / f"{split}.jsonl").open()]
    assert len(rows) >= 10
    for r in rows:
        assert set(r) == {"question", "answer"}
        assert D.normalize_number(D.extract_hash_answer(r["answer"])) is not None
        notes = re.findall(r"<<([^=>]+)=([^>]+)>>", r["answer"])
        assert notes, r["question"]
        for expr, value in notes:
            assert _calc(expr) == Fraction(value), (expr, value)


# ------------------------------------------------------------------ loading


def test_load_gsm8k_from_the_sample_a_folder_a_file_and_the_env(monkeypatch):
    a = D.load_gsm8k("train", source="sample")
    b = D.load_gsm8k("train", source=SAMPLE)
    c = D.load_gsm8k("test", source=SAMPLE / "test.jsonl")
    assert a.column_names == ["question", "answer"] and a.num_rows == b.num_rows == 30
    assert c.num_rows == 10
    monkeypatch.setenv(D.GSM8K_DIR_ENV, str(SAMPLE))
    assert D.load_gsm8k("test").num_rows == 10


def test_load_gsm8k_errors_say_what_to_do(monkeypatch, tmp_path):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub")

    monkeypatch.delenv(D.GSM8K_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(D.GSM8KUnavailableError) as err:
        D.load_gsm8k("train")
    msg = str(err.value)
    assert "openai/gsm8k" in msg and "source=" in msg and D.GSM8K_DIR_ENV in msg and "sample" in msg
    monkeypatch.undo()
    with pytest.raises(D.GSM8KUnavailableError, match="train.jsonl"):
        D.load_gsm8k("train", source=tmp_path)
    with pytest.raises(D.DataError, match="'train' and 'test'"):
        D.load_gsm8k("validation", source="sample")
    bad = tmp_path / "train.jsonl"
    bad.write_text(json.dumps({"problem": "x", "answer": "#### 1"}) + "\n")
    with pytest.raises(D.DataError, match=r"lack the column\(s\) \['question'\]"):
        D.load_gsm8k("train", source=tmp_path)


def test_parse_gsm8k_keeps_a_row_without_marker_for_validate_to_report():
    rows = D.parse_gsm8k([{"question": "Q1", "answer": "1 + 1 = <<1+1=2>>2\n#### 2"},
                          {"question": "Q2", "answer": "I think it is 3"}])
    assert rows["answer"] == ["2", None]
    assert rows["solution"][0] == "1 + 1 = 2"
    report = D.validate(rows, strict=False)
    assert [(p.index, p.field, p.kind) for p in report.problems] == [(1, "answer", "missing_answer")]
    assert "####" in str(report.problems[0])


def test_load_custom_maps_columns_and_keeps_extras(tmp_path):
    ds = D.load_custom(ROOT / "data" / "custom_example.csv", question="problem", answer="result")
    assert ds.column_names == ["question", "answer", "unit", "difficulty"]
    assert ds.num_rows >= 10 and D.validate(ds).ok
    only = D.load_custom(ROOT / "data" / "custom_example.csv", question="problem",
                         answer="result", keep=["unit"])
    assert only.column_names == ["question", "answer", "unit"]
    jl = tmp_path / "mine.jsonl"
    jl.write_text('{"q": "1+1?", "a": 2, "tag": "x"}\n{"q": "2+2?", "a": "4", "tag": "y"}\n')
    mine = D.load_custom(jl, question="q", answer="a")
    assert mine["answer"] == ["2", "4"] and mine["tag"] == ["x", "y"]


def test_load_custom_errors_name_the_column_and_fix(tmp_path):
    path = ROOT / "data" / "custom_example.csv"
    with pytest.raises(D.DataError, match=r"no column 'question'.*problem.*question="):
        D.load_custom(path)
    with pytest.raises(D.DataError, match="nope"):
        D.load_custom(path, question="problem", answer="result", keep=["nope"])
    with pytest.raises(D.DataError, match="No file"):
        D.load_custom(tmp_path / "missing.csv")
    (tmp_path / "x.txt").write_text("a")
    with pytest.raises(D.DataError, match=".csv"):
        D.load_custom(tmp_path / "x.txt")
    (tmp_path / "empty.csv").write_text("question,answer\n")
    with pytest.raises(D.DataError, match="no rows"):
        D.load_custom(tmp_path / "empty.csv")


def test_data_file_finds_the_checkout_copy():
    assert D.data_file("custom_example.csv") == ROOT / "data" / "custom_example.csv"


# ------------------------------------------------------------------ validation


def _broken():
    return D.load_custom(ROOT / "data" / "custom_broken.csv", question="problem", answer="result")


def test_validate_strict_names_row_field_and_fix():
    with pytest.raises(D.DataValidationError) as err:
        D.validate(_broken())
    msg = str(err.value)
    assert "row 1, field 'question'" in msg and "row 2, field 'answer'" in msg
    assert "'twelve' is not a number" in msg and "Fix:" in msg
    assert err.value.report.counts() == {"empty_question": 1, "not_a_number": 1,
                                         "duplicate": 1, "missing_answer": 1}


def test_validate_lenient_returns_every_problem():
    report = D.validate(_broken(), strict=False)
    assert not report.ok and report.n_rows == 6
    assert report.bad_rows == [1, 2, 3, 4]
    dup = [p for p in report.problems if p.kind == "duplicate"][0]
    assert dup.index == 3 and "row 0" in dup.message
    frame = report.to_frame()
    assert list(frame["index"]) == [1, 2, 3, 4] and "fix" in frame.columns
    assert "4 problem(s) in 6 rows" in str(report)


def test_validate_options_and_missing_columns():
    rows = [{"question": "Colour of the sky?", "answer": "blue"}]
    assert D.validate(rows, numeric_answer=False).ok
    assert not D.validate(rows, strict=False).ok
    dups = [{"question": "A", "answer": "1"}, {"question": "a", "answer": "1"}]
    assert D.validate(dups, check_duplicates=False).ok
    report = D.validate([{"text": "x", "answer": "1"}], strict=False)
    assert [(p.index, p.field, p.kind) for p in report.problems] == [(None, "question", "missing_column")]
    assert "all rows, field 'question'" in str(report.problems[0])
    import datasets

    assert D.validate(datasets.Dataset.from_dict({"question": [], "answer": []})).ok
    assert "no problems" in D.validate(rows, numeric_answer=False).summary()


def test_dedupe_keeps_first_and_reports_removed():
    import datasets

    rows = [{"question": "What is 2+3?"}, {"question": "what is 2+3"}, {"question": "B"},
            {"question": "b."}]
    kept, removed = D.dedupe(rows)
    assert [r["question"] for r in kept] == ["What is 2+3?", "B"] and removed == [1, 3]
    kept_ds, removed = D.dedupe(datasets.Dataset.from_list(rows))
    assert isinstance(kept_ds, datasets.Dataset) and kept_ds.num_rows == 2


# ------------------------------------------------------------------ prompts


def test_build_prompt_conversational_and_prefilled():
    p = D.build_prompt("What is 2 + 3?")
    assert p == [{"role": "system", "content": SYSTEM_PROMPT},
                 {"role": "user", "content": "What is 2 + 3?"}]
    pre = D.build_prompt("What is 2 + 3?", prefill=True)
    assert pre[-1] == {"role": "assistant", "content": REASONING_START + "\n"}
    assert D.add_prefill(pre) == pre  # already prefilled: unchanged
    assert D.build_prompt("Q", system_prompt=None) == [{"role": "user", "content": "Q"}]


def test_fold_system_prompt_rule():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
            {"role": "assistant", "content": "A"}, {"role": "user", "content": "U2"}]
    folded = D.fold_system_prompt(msgs)
    assert folded == [{"role": "user", "content": "S\n\nU1"}, {"role": "assistant", "content": "A"},
                      {"role": "user", "content": "U2"}]
    assert msgs[1]["content"] == "U1"  # input untouched
    assert D.fold_system_prompt(msgs[1:]) == msgs[1:]
    assert D.fold_system_prompt([{"role": "system", "content": "S"}]) == [{"role": "user", "content": "S"}]
    assert D.build_prompt("Q", system_role=False, prefill=True) == [
        {"role": "user", "content": f"{SYSTEM_PROMPT}\n\nQ"},
        {"role": "assistant", "content": REASONING_START + "\n"}]


def test_build_text_prompt_and_reference_completion():
    text = D.build_text_prompt("What is 2 + 3?", prefill=True)
    assert text.startswith(SYSTEM_PROMPT) and text.endswith("Answer:\n<reasoning>\n")
    full = D.reference_completion("2 + 3 = 5", "5")
    assert full == "<reasoning>\n2 + 3 = 5\n</reasoning>\n<answer>\n5\n</answer>"
    assert REASONING_START + "\n" + D.reference_completion("2 + 3 = 5", "5", prefilled=True) == full


class FakeNoSystemTokenizer:
    """A template that rejects the system role, as Gemma 2's does."""

    name_or_path = "fake-no-system"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False,
                            continue_final_message=False):
        out = ""
        for m in messages:
            if m["role"] == "system":
                raise ValueError("System role not supported")
            out += f"<start_of_turn>{m['role']}\n{m['content']}"
            if not (continue_final_message and m is messages[-1]):
                out += "<end_of_turn>\n"
        return out + ("<start_of_turn>model\n" if add_generation_prompt else "")

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [t.split() for t in texts]}


class FakeDroppingTokenizer(FakeNoSystemTokenizer):
    """A template that renders a system message by silently dropping it."""

    def apply_chat_template(self, messages, **kwargs):
        return super().apply_chat_template([m for m in messages if m["role"] != "system"], **kwargs)


def test_supports_system_role_detects_rejecting_and_dropping_templates(tok):
    assert D.supports_system_role(tok) is True
    assert D.supports_system_role(FakeNoSystemTokenizer()) is False
    assert D.supports_system_role(FakeDroppingTokenizer()) is False


def test_system_role_is_folded_for_a_template_without_it():
    fake = FakeNoSystemTokenizer()
    ds = D.add_prompts([{"question": "What is 2 + 3?", "answer": "5"}], fake)
    prompt = ds[0]["prompt"]
    assert [m["role"] for m in prompt] == ["user"] and prompt[0]["content"].startswith(SYSTEM_PROMPT)
    assert SYSTEM_PROMPT in D.render(fake, prompt)  # renders without raising
    assert ds[0]["prompt_tokens"] > 0


def test_gemma_style_jinja_template_with_the_real_tokenizer(tok):
    import copy

    gemma_like = copy.deepcopy(tok)
    gemma_like.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    assert not D.supports_system_role(gemma_like)
    with pytest.raises(Exception, match="System role"):
        D.render(gemma_like, D.build_prompt("Q"))
    text = D.render(gemma_like, D.build_prompt("Q", system_role=False))
    assert text == f"<start_of_turn>user\n{SYSTEM_PROMPT}\n\nQ<end_of_turn>\n<start_of_turn>model\n"


def test_render_with_the_bundled_template(tok):
    text = D.render(tok, D.build_prompt("What is 2 + 3?"))
    assert text == (f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    pre = D.render(tok, D.build_prompt("What is 2 + 3?", prefill=True))
    assert pre.endswith("<|im_start|>assistant\n<reasoning>\n")  # continued, not closed


def test_count_prompt_tokens_matches_the_tokenizer(tok):
    prompts = [D.build_prompt("What is 2 + 3?"), D.build_prompt("What is 2 + 3? " * 20)]
    counts = D.count_prompt_tokens(prompts, tok)
    assert counts[0] == len(tok(D.render(tok, prompts[0]), add_special_tokens=False)["input_ids"])
    assert counts[1] > counts[0] + 40
    assert D.count_prompt_tokens([], tok) == []


def test_length_stats_and_histogram():
    import matplotlib

    matplotlib.use("Agg")
    stats = D.length_stats([10, 20, 30, 40, 1000])
    assert stats["n"] == 5 and stats["p50"] == 30.0 and stats["max"] == 1000.0
    assert D.length_stats([]) == {"n": 0}
    fig = D.plot_token_lengths([10, 20, 30, 400], budget=256)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "budget 256 (1 over)" in labels


def test_filter_by_budget_counts_what_it_removes():
    import datasets

    rows = [{"q": "a", "prompt_tokens": 10}, {"q": "b", "prompt_tokens": 300},
            {"q": "c", "prompt_tokens": 256}]
    kept, removed = D.filter_by_budget(rows, 256)
    assert [r["q"] for r in kept] == ["a", "c"] and removed == 1
    kept_ds, removed = D.filter_by_budget(datasets.Dataset.from_list(rows), 100)
    assert kept_ds["q"] == ["a"] and removed == 2
    with pytest.raises(D.DataError, match="add_prompts"):
        D.filter_by_budget([{"q": "a"}], 10)
    with pytest.raises(D.DataError, match="add_prompts"):
        D.filter_by_budget(datasets.Dataset.from_list([{"q": "a"}]), 10)


# ------------------------------------------------------------------ split


def _rows(n, prefix="q"):
    return [{"question": f"{prefix} {i}?", "answer": str(i)} for i in range(n)]


def test_split_is_seeded_and_disjoint():
    a, info = D.split_train_eval(_rows(50), eval_rows=10, seed=1)
    b, _ = D.split_train_eval(_rows(50), eval_rows=10, seed=1)
    c, _ = D.split_train_eval(_rows(50), eval_rows=10, seed=2)
    assert a["eval"]["question"] == b["eval"]["question"] != c["eval"]["question"]
    assert not set(a["train"]["question"]) & set(a["eval"]["question"])
    assert (info["train"], info["eval"]) == (40, 10)
    capped, info = D.split_train_eval(_rows(50), eval_rows=10, seed=1, train_rows=5)
    assert capped["train"].num_rows == 5 and info["requested_train"] == 5


def test_split_refuses_duplicates_and_too_few_rows():
    rows = _rows(5) + [{"question": "Q 0", "answer": "0"}]
    with pytest.raises(D.DataError, match="dedupe"):
        D.split_train_eval(rows, eval_rows=2, seed=0)
    with pytest.raises(D.DataError, match="too few"):
        D.split_train_eval(_rows(3), eval_rows=3, seed=0)
    with pytest.raises(D.DataError, match="at least 1"):
        D.split_train_eval(_rows(3), eval_rows=0, seed=0)


def test_split_from_an_eval_source_removes_leaked_train_rows():
    train = _rows(20)
    test = _rows(3, prefix="other") + [{"question": "Q 5", "answer": "5"}]
    splits, info = D.split_train_eval(train, eval_rows=4, seed=0, eval_source=test)
    assert splits["eval"].num_rows == 4
    assert "q 5?" not in splits["train"]["question"] and info["leaked_removed"] == 1
    assert splits["train"].num_rows == 19


def test_prepare_dedupes_near_duplicates_before_splitting(tok):
    rows = _rows(30) + [{"question": "  Q 3 ", "answer": "3"}, {"question": "q 7", "answer": "7"}]
    splits, card = D.prepare_dataset(rows, tok, train_rows=None, eval_rows=8,
                                     max_prompt_tokens=256, seed=0)
    train = {D.normalize_question(q) for q in splits["train"]["question"]}
    ev = {D.normalize_question(q) for q in splits["eval"]["question"]}
    assert not train & ev
    assert card["counts"]["rows"]["duplicates_removed"] == 2
    assert splits["train"].num_rows + splits["eval"].num_rows == 30


# ------------------------------------------------------------------ pipeline, save, load


def test_prepare_strict_raises_on_the_broken_csv_and_lenient_counts(tok):
    with pytest.raises(D.DataValidationError, match="row 2, field 'answer'"):
        D.prepare_dataset(_broken(), tok, train_rows=None, eval_rows=1, max_prompt_tokens=256, seed=0)
    splits, card = D.prepare_dataset(_broken(), tok, train_rows=None, eval_rows=1,
                                     max_prompt_tokens=256, seed=0, strict=False)
    rows = card["counts"]["rows"]
    assert rows == {"loaded": 6, "invalid_removed": 3, "duplicates_removed": 1,
                    "over_budget_removed": 0, "kept": 2}
    assert splits["train"].num_rows + splits["eval"].num_rows == 2
    assert "unit" in splits["train"].column_names  # extra columns survive for rewards


def test_prepare_budget_filter_is_counted_and_answers_normalised(tok):
    rows = [{"question": f"What is {i} + 1?", "answer": f"${i + 1:,}"} for i in range(1000, 1020)]
    rows.append({"question": "word " * 400, "answer": "1"})
    splits, card = D.prepare_dataset(rows, tok, train_rows=None, eval_rows=5,
                                     max_prompt_tokens=100, seed=0)
    assert card["counts"]["rows"]["over_budget_removed"] == 1
    assert max(list(splits["train"]["prompt_tokens"]) + list(splits["eval"]["prompt_tokens"])) <= 100
    assert all(re.fullmatch(r"\d+", a) for a in splits["train"]["answer"])
    assert card["token_lengths"]["max"] > 400
    assert card["format"]["system_role"] is True and card["format"]["prompt"] == "conversational"


def test_save_and_load_round_trip_with_card(tmp_path):
    splits, _ = D.split_train_eval(D.add_prompts(_rows(12)), eval_rows=3, seed=0)
    path = D.save_prepared(splits, tmp_path / "dataset", {"source": {"task": "test"}, "seed": 0})
    back = D.load_prepared(path)
    assert list(back) == ["train", "eval"] and back["eval"]["question"] == splits["eval"]["question"]
    assert back["train"][0]["prompt"][0]["role"] == "system"
    assert D.read_card(path)["source"] == {"task": "test"}
    D.save_prepared(splits, path, {"seed": 1})  # overwrite in place
    assert D.read_card(path) == {"seed": 1}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left
    assert D.read_card(tmp_path) == {}


def test_load_prepared_errors_say_how_to_rebuild(tmp_path):
    import datasets

    with pytest.raises(D.DataError, match="ensure_prepared"):
        D.load_prepared(tmp_path / "nothing")
    only_train = datasets.DatasetDict({"train": D.add_prompts(_rows(3))})
    only_train.save_to_disk(str(tmp_path / "one"))
    with pytest.raises(D.DataError, match="'eval' split"):
        D.load_prepared(tmp_path / "one")
    no_prompt = datasets.DatasetDict({"train": datasets.Dataset.from_list(_rows(3)),
                                      "eval": datasets.Dataset.from_list(_rows(2))})
    no_prompt.save_to_disk(str(tmp_path / "two"))
    with pytest.raises(D.DataError, match=r"lacks column\(s\) \['prompt'\]"):
        D.load_prepared(tmp_path / "two")
    with pytest.raises(D.DataError, match="'eval' split"):
        D.save_prepared(only_train, tmp_path / "x", {})


def test_ensure_prepared_builds_then_loads_then_rebuilds_on_new_settings(tmp_path, tok, capsys):
    smoke = get_profile("cpu-smoke")
    ds = D.ensure_prepared(smoke, tmp_path, tokenizer=tok)
    assert (ds["train"].num_rows, ds["eval"].num_rows) == (smoke.train_rows, smoke.eval_rows)
    row = ds["train"][0]
    assert row["prompt"][-1]["role"] == "user" and row["level"] == smoke.task_level
    assert D.normalize_number(row["answer"]) == row["answer"]
    card = D.read_card(tmp_path / "dataset")
    assert card["origin"] == "ensure_prepared" and card["spec"]["task_level"] == smoke.task_level
    stamp = (tmp_path / "dataset" / D.CARD_NAME).stat().st_mtime_ns
    again = D.ensure_prepared(smoke, tmp_path)  # no tokenizer needed to load
    assert again["eval"]["question"] == ds["eval"]["question"]
    assert (tmp_path / "dataset" / D.CARD_NAME).stat().st_mtime_ns == stamp
    bigger = smoke.with_overrides(train_rows=20, eval_rows=5, task_level="add3")
    capsys.readouterr()
    ds3 = D.ensure_prepared(bigger, tmp_path, tokenizer=tok)
    assert "Rebuilding" in capsys.readouterr().out
    assert ds3["train"].num_rows == 20 and ds3["train"][0]["level"] == "add3"


def test_ensure_prepared_keeps_a_dataset_you_saved_yourself(tmp_path):
    splits, _ = D.split_train_eval(D.add_prompts(_rows(12)), eval_rows=3, seed=0)
    D.save_prepared(splits, tmp_path / "dataset", {"origin": "notebook 01 exercise"})
    ds = D.ensure_prepared(get_profile("cpu-smoke"), tmp_path)
    assert ds["train"].num_rows == 9


def test_ensure_prepared_gsm8k_from_local_files_uses_the_test_split_for_eval(tmp_path, tok):
    profile = get_profile("colab-t4").with_overrides(model="smollm2-135m", eval_rows=4, train_rows=20)
    ds = D.ensure_prepared(profile, tmp_path, tokenizer=tok, gsm8k_source=SAMPLE)
    test_qs = {json.loads(line)["question"] for line in (SAMPLE / "test.jsonl").open()}
    assert set(ds["eval"]["question"]) <= test_qs and ds["eval"].num_rows == 4
    assert ds["train"].num_rows == 20 and not set(ds["train"]["question"]) & test_qs
    card = D.read_card(tmp_path / "dataset")
    assert card["source"]["task"] == "gsm8k" and card["counts"]["eval_source"]["loaded"] == 10


def test_ensure_prepared_gsm8k_offline_says_what_to_do(tmp_path, tok, monkeypatch):
    import datasets

    monkeypatch.delenv(D.GSM8K_DIR_ENV, raising=False)
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(D.GSM8KUnavailableError, match="local files"):
        D.ensure_prepared(get_profile("colab-t4"), tmp_path, tokenizer=tok)
    assert not (tmp_path / "dataset").exists()


def test_unknown_task_is_an_error(tmp_path, tok):
    with pytest.raises(D.DataError, match="'arithmetic' or 'gsm8k'"):
        D.ensure_prepared(get_profile("cpu-smoke").with_overrides(task="poetry"), tmp_path, tokenizer=tok)


def test_data_file_on_a_bare_install_fetches_once_or_says_what_to_do(tmp_path, monkeypatch):
    import io
    import urllib.request

    import helpers.config

    monkeypatch.setattr(helpers.config, "project_root", lambda: None)
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    urls = []

    def fake_urlopen(url, timeout=None):
        urls.append(url)
        return io.BytesIO(b"question,answer\n")

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    path = D.data_file("custom_example.csv")
    assert path == tmp_path / "data" / "custom_example.csv" and path.read_text() == "question,answer\n"
    assert urls == ["https://raw.githubusercontent.com/grpo-course/grpo-course/main/data/custom_example.csv"]
    assert D.data_file("custom_example.csv") == path and len(urls) == 1  # cached

    def offline(url, timeout=None):
        raise OSError("no network")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match="pip install -e"):
        D.data_file("gsm8k_sample/train.jsonl")


def test_count_prompt_tokens_uses_the_text_tokenizer_of_a_processor(tok):
    class Processor:
        """Like a multimodal processor: renders chats, but its first argument is images."""

        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

        def apply_chat_template(self, *args, **kwargs):
            return self.tokenizer.apply_chat_template(*args, **kwargs)

        def __call__(self, images=None, text=None, **kwargs):
            raise AssertionError("a processor must not be called with texts as images")

    prompts = [D.build_prompt("What is 2 + 3?")]
    assert D.count_prompt_tokens(prompts, Processor(tok)) == D.count_prompt_tokens(prompts, tok)
