"""helpers.curriculum: which training prompts a pass-rate filter keeps, and in what order (no model: the pass rates
are given)."""

import pytest
from datasets import Dataset

from helpers import curriculum
from helpers.curriculum import keep_indices, select_by_pass_rate
from helpers.profiles import get_profile


def test_keep_indices_drops_the_prompts_never_or_always_solved():
    rates = [0.0, 0.25, 1.0, 0.5, 0.0]
    assert keep_indices(rates) == [1, 3]
    assert keep_indices(rates, drop_always=False) == [1, 2, 3]
    assert keep_indices(rates, drop_never=False) == [0, 1, 3, 4]


@pytest.fixture
def rows():
    return Dataset.from_list([{"question": f"q{i}", "answer": str(i)} for i in range(10)])


def given(monkeypatch, rates):
    seen = {}

    def fake(model, tokenizer, rows, task, profile, samples, chat_template_kwargs=None):
        seen.update(n=rows.num_rows, samples=samples)
        return rates

    monkeypatch.setattr(curriculum, "pass_rates", fake)
    return seen


def test_filter_keeps_the_sometimes_solved_and_pads_with_unmeasured_rows(monkeypatch, rows):
    seen = given(monkeypatch, [0.0, 0.5, 1.0, 0.25])
    kept, info = select_by_pass_rate(None, None, rows, None, get_profile("cpu-smoke"), candidates=4, samples=4,
                                     min_rows=5)
    assert seen == {"n": 4, "samples": 4}  # only the candidates are sampled
    assert kept["question"] == ["q1", "q3", "q4", "q5", "q6"]  # 2 kept, then 3 unmeasured rows to reach 5
    assert info["kept"] == 2 and info["never"] == 1 and info["always"] == 1 and info["padded_with_unmeasured"] == 3
    assert info["mean_pass_rate"] == 0.4375


def test_order_puts_the_most_often_solved_first_and_keeps_every_row(monkeypatch, rows):
    given(monkeypatch, [0.0, 0.5, 1.0, 0.25])
    ordered, info = select_by_pass_rate(None, None, rows, None, get_profile("cpu-smoke"), candidates=4, samples=2,
                                        mode="order")
    assert ordered["question"] == ["q2", "q1", "q3", "q0"] + [f"q{i}" for i in range(4, 10)]
    assert info["mode"] == "order" and info["kept"] == 4


def test_an_unknown_mode_is_refused(rows):
    with pytest.raises(ValueError, match="use 'filter'"):
        select_by_pass_rate(None, None, rows, None, get_profile("cpu-smoke"), 4, 4, mode="shuffle")


def test_the_profile_refuses_an_unknown_mode_too():
    from helpers.profiles import ProfileError
    with pytest.raises(ProfileError, match="select_mode='shuffle'"):
        get_profile("cpu-smoke", select_mode="shuffle")


def test_pass_rates_are_each_rows_share_of_right_samples(monkeypatch):
    import helpers.evaluation as evaluation

    calls = {}

    def fake_evaluate(model, tokenizer, rows, task, settings, chat_template_kwargs=None):
        calls["settings"] = settings
        scored = [(0, 1.0), (0, 0.0), (1, 0.0), (1, 0.0), (2, 1.0), (2, 1.0)]
        return {"rows": [{"index": i, "accuracy": a} for i, a in scored]}

    monkeypatch.setattr(evaluation, "evaluate", fake_evaluate)
    task = type("T", (), {"headline": "accuracy"})()
    profile = get_profile("cpu-demo")
    assert curriculum.pass_rates(None, None, [1, 2, 3], task, profile, samples=2) == [0.5, 0.0, 1.0]
    assert calls["settings"].num_return_sequences == 2 and calls["settings"].temperature == profile.temperature


def test_the_profile_sets_the_selection_and_trainings_random_stream_is_left_as_it_was(monkeypatch, rows):
    import torch
    seen = {}

    def fake(model, tokenizer, dataset, task, profile, candidates, samples, mode, chat_template_kwargs=None,
             min_rows=None):
        torch.manual_seed(0)  # sampling seeds torch, as helpers.generation.generate does
        seen.update(task=task.name, candidates=candidates, samples=samples, mode=mode, min_rows=min_rows)
        return dataset, {}

    monkeypatch.setattr(curriculum, "select_by_pass_rate", fake)
    profile = get_profile("cpu-demo", select_prompts=64, select_mode="order")
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    curriculum.select_for_profile(None, None, rows, profile)
    assert torch.equal(torch.rand(3), expected)
    per_step = profile.per_device_train_batch_size * profile.gradient_accumulation_steps // profile.num_generations
    assert seen == {"task": profile.task, "candidates": 64, "samples": profile.select_samples, "mode": "order",
                    "min_rows": profile.max_steps * per_step}
