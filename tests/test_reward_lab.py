"""helpers.reward_lab: the case harness, score tables, group advantages (checked against TRL's trainer)."""

from __future__ import annotations

import math
import statistics

import pytest

from helpers.reward_lab import (
    GroupAdvantages,
    RewardCase,
    assert_cases,
    check_cases,
    group_advantages,
    score_table,
)
from helpers.tasks import get_task
from helpers.tasks.orders import JSON_PREFILL
from helpers.tasks.reasoning import correctness_reward, numeric_answer_reward, strict_format_reward

GOOD = "<reasoning>\n2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>"


def named(name, func):
    func.__name__ = name
    return func


# --------------------------------------------------------------------------- the case harness

HARNESS = [correctness_reward, strict_format_reward, numeric_answer_reward]


def test_check_cases_reports_pass_fail_and_missing():
    cases = [
        RewardCase(GOOD, {"correctness_reward": 2.0, "strict_format_reward": 1.0}, answer="4", note="good"),
        RewardCase("<answer>5</answer>", {"correctness_reward": 2.0}, answer="4", note="wrong on purpose"),
        RewardCase(GOOD, {"typo_reward": 1.0}, note="unknown reward"),
        RewardCase("<answer>x</answer>", {"numeric_answer_reward": None}, note="None expected, 0.0 got"),
    ]
    t = check_cases(cases, HARNESS)
    assert list(t.columns) == ["case", "note", "completion", "reward", "expected", "got", "passed"]
    assert t["passed"].tolist() == [True, True, False, False, False]
    assert t["case"].tolist() == [0, 0, 1, 2, 3]
    assert t.loc[3, "got"] == "missing" and t.loc[4, "got"] == 0.0
    assert t.loc[0, "completion"].startswith("<reasoning> \u21b5 2 + 2") and t.loc[0, "completion"].endswith("\u2026")
    with pytest.raises(AssertionError, match="3 of 5 reward checks failed") as err:
        assert_cases(cases, HARNESS)
    assert "wrong on purpose" in str(err.value) and "typo_reward" in str(err.value)
    assert "good" not in str(err.value).split("\n", 1)[1]
    passing = assert_cases(cases[:1], HARNESS)
    assert passing["passed"].all() and len(passing) == 2


def test_check_cases_shows_a_raising_reward_as_failed():
    def raw_reward(prompts=None, completions=None, **kw):
        raise KeyError("answer")

    t = check_cases([RewardCase("x", {"raw_reward": 1.0})], [raw_reward])
    assert not t["passed"].any() and t.loc[0, "got"] == "raised KeyError: 'answer'"


def test_check_cases_passes_what_the_trainer_would():
    seen = {}

    def col_reward(prompts, completions, completion_ids, level, **kw):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, kwargs=kw)
        return [10.0 if lv == "hard" else 0.0 for lv in level]

    t = check_cases([RewardCase("x", {"col_reward": 10.0}, answer="7", columns={"level": "hard"})], [col_reward])
    assert t["passed"].all()
    assert seen == {"prompts": [None], "completions": ["x"], "completion_ids": None, "kwargs": {"answer": ["7"]}}


def test_check_cases_tolerance_and_none():
    half = named("half_reward", lambda completions, **kw: [0.5 + 1e-9, None][:len(completions)])
    assert check_cases([RewardCase("x", {"half_reward": 0.5})], [half])["passed"].all()
    assert not check_cases([RewardCase("x", {"half_reward": 0.6})], [half], tol=0.05)["passed"].any()
    assert check_cases([RewardCase("x", {"half_reward": 0.6})], [half], tol=0.2)["passed"].all()
    none = named("none_reward", lambda completions, **kw: [None])
    t = check_cases([RewardCase("x", {"none_reward": None}), RewardCase("x", {"none_reward": 0.0})], [none])
    assert t["passed"].tolist() == [True, False]


# --------------------------------------------------------------------------- score tables


def test_score_table_columns_and_weighted_total():
    comps = [GOOD, [{"role": "assistant", "content": "<answer>5</answer>"}], "nothing"]
    t = score_table(comps, [(correctness_reward, 1.0), (numeric_answer_reward, 0.5), (strict_format_reward, 2.0)],
                    answer=["4", "4", "4"])
    assert list(t.columns) == ["completion", "correctness_reward", "numeric_answer_reward",
                               "strict_format_reward", "total"]
    assert t["total"].tolist() == [2.0 + 0.25 + 2.0, 0.25, 0.0]
    assert t["completion"][1] == "<answer>5</answer>"


def test_score_table_width_and_what_it_passes():
    seen = {}

    def spy_reward(prompts, completions, completion_ids, **kw):
        seen.update(prompts=prompts, completion_ids=completion_ids, kwargs=kw)
        return [1.0] * len(completions)

    long = "x" * 100 + "\nend"
    assert score_table([long], [spy_reward])["completion"][0] == "x" * 59 + "\u2026"
    assert score_table([long], [spy_reward], width=None)["completion"][0] == "x" * 100 + " \u21b5 end"
    assert seen["prompts"] is None and seen["completion_ids"] is None
    score_table(["a", "b"], [spy_reward], prompts=("p", "q"), completion_ids=[(1,), (2, 3)], answer=("1", "2"))
    assert seen == {"prompts": ["p", "q"], "completion_ids": [[1], [2, 3]], "kwargs": {"answer": ["1", "2"]}}


def test_score_table_skips_none_like_trl():
    sometimes = named("sometimes_reward", lambda completions, **kw: [None, 1.0])
    never = named("never_reward", lambda completions, **kw: [None, None])
    t = score_table(["a", "b"], [sometimes])
    assert math.isnan(t["sometimes_reward"][0]) and math.isnan(t["total"][0]) and t["total"][1] == 1.0
    t2 = score_table(["a", "b"], [(sometimes, 1.0), (correctness_reward, 1.0)], answer=["1", "1"])
    assert t2["total"].tolist() == [0.0, 1.0]  # nansum: the None is skipped, the row still has a total
    assert math.isnan(score_table(["a", "b"], [never])["total"][1])


def test_score_table_errors_name_the_problem():
    with pytest.raises(ValueError, match="Column 'answer' has 1 values for 2 completions"):
        score_table(["a", "b"], [correctness_reward], answer=["1"])
    short = named("short_reward", lambda completions, **kw: [1.0])
    with pytest.raises(ValueError, match="Reward 'short_reward' returned 1 scores for 2 completions"):
        score_table(["a", "b"], [short])


def test_score_table_with_a_tasks_prefilled_rewards():
    generated = "2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>"
    t = score_table([generated, "<reasoning>\n" + generated], get_task("arithmetic").rewards, answer=["4", "4"])
    assert t["prefilled_strict_format_reward"].tolist() == [1.0, 0.0]
    assert t.loc[0, "total"] == 2.0 * 1.0 + 1.0 * 0.5 + 1.0 * 0.5 + 1.0 * 0.25


def test_score_table_passes_every_column_the_json_task_reads():
    gold, schema = '{"name": "Ava"}', '{"type": "object", "required": ["name"]}'
    t = score_table([gold[len(JSON_PREFILL):], "no object"], get_task("json").rewards, answer=[gold] * 2,
                    schema=[schema] * 2)
    assert t["prefilled_schema_valid_reward"].tolist() == [1.0, 0.0]
    assert t["total"].tolist() == [0.5 * 1.0 + 0.5 * 1.0 + 2.0 * 1.0 + 1.0 * 1.0, 0.0]


# --------------------------------------------------------------------------- group advantages


def test_group_advantages_by_hand():
    r = [1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]
    a = group_advantages(r, group_size=4)
    std = statistics.stdev([1.0, 0.0, 0.0, 0.0])  # Bessel-corrected, like TRL
    assert a.advantages[:4] == pytest.approx([0.75 / (std + 1e-4)] + [-0.25 / (std + 1e-4)] * 3, rel=1e-5)
    assert a.advantages[4:] == [0.0] * 4
    assert a.group_mean == [0.25, 2.0] and a.group_std == pytest.approx([std, 0.0])
    assert a.frac_zero_std == 0.5 and a.rewards == r


def test_group_advantages_with_unscored_completions():
    a = group_advantages([2.0, None, 0.0, float("nan"), None, None], group_size=3)
    assert a.group_mean[0] == 1.0 and a.advantages[1] == 0.0  # no score: advantage 0, left out of the mean
    assert a.advantages[0] == pytest.approx(1.0 / (math.sqrt(2) + 1e-4), rel=1e-5)
    assert a.advantages[3:] == [0.0, 0.0, 0.0]  # a group with no score at all
    assert a.frac_zero_std == 0.0  # NaN std is not "close to 0" (as TRL logs it)


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="4 rewards do not split into groups of 3"):
        group_advantages([1, 2, 3, 4], 3)
    with pytest.raises(ValueError, match="groups of 1"):
        group_advantages([1, 2], 1)


@pytest.mark.slow
def test_totals_and_advantages_match_trls_own_grpo_trainer(tmp_path):
    """TRL's GRPOTrainer scores a scripted batch (some None, a group all equal, a group unscorable):
    score_table's totals and group_advantages give what the trainer computes with its default scale_rewards."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from helpers.models import bundled_model_path, prepare_tokenizer

    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(bundled_model_path(build=False)))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         pad_token_id=tok.pad_token_id))
    G, prompts = 4, 4
    script_a = [1.0, 0.0, 0.0, 2.0, 1.0, 1.0, 1.0, 1.0, 0.0, None, 3.0, 0.5, None, None, None, None]
    script_b = [0.5, 0.5, None, 0.0, 0.0, 0.0, 0.0, 0.0, None, None, 1.0, 0.0, None, None, None, None]
    a_reward = named("a_reward", lambda completions, **kw: script_a[:len(completions)])
    b_reward = named("b_reward", lambda completions, **kw: script_b[:len(completions)])
    rewards = [(a_reward, 1.0), (b_reward, 2.0)]
    totals = score_table(["x"] * len(script_a), rewards)["total"].tolist()

    args = GRPOConfig(output_dir=str(tmp_path), num_generations=G, per_device_train_batch_size=G * prompts,
                      max_completion_length=3, report_to=[], use_cpu=True, scale_rewards="group",
                      reward_weights=[w for _, w in rewards], logging_steps=1, bf16=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[f for f, _ in rewards], args=args, processing_class=tok,
                          train_dataset=Dataset.from_list([{"prompt": f"Q{i}"} for i in range(prompts)]))
    trainer.model.train()
    out = trainer._generate_and_score_completions([{"prompt": f"Q{i // G}"} for i in range(G * prompts)])
    mine = group_advantages(totals, G)
    assert mine.advantages == pytest.approx(out["advantages"].tolist(), abs=1e-6)
    metrics = trainer._metrics["train"]
    assert metrics["frac_reward_zero_std"][-1] == pytest.approx(mine.frac_zero_std)
    assert metrics["reward"][-1] == pytest.approx(float(torch.tensor(totals).nanmean()))
    assert metrics["rewards/b_reward/mean"][-1] == pytest.approx(2.0 / 9)  # logged by __name__, None skipped
    assert math.isnan(totals[9]) and all(math.isnan(t) for t in totals[12:])  # unscorable rows
    assert isinstance(mine, GroupAdvantages) and mine.frac_zero_std == 0.25  # one group of four all equal


def test_the_group_std_is_trls_nanstd():
    import torch
    from trl.trainer.utils import nanstd as trl_nanstd

    gen = torch.Generator().manual_seed(0)
    values = torch.randn(5, 6, generator=gen)
    values[0, :5] = float("nan")          # one value left: std undefined (NaN) in both
    values[1, 2] = float("nan")
    values[3] = 2.0                       # all equal: std 0
    ours, theirs = torch.tensor(group_advantages(values.flatten().tolist(), 6).group_std), trl_nanstd(values, dim=1)
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs)) and torch.isnan(ours[0])
    assert torch.allclose(ours.nan_to_num(), theirs.nan_to_num(), atol=1e-6) and ours[3] == 0
