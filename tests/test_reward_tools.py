"""Tests for helpers.reward_tools: the case harness, score_table, group_advantages (vs TRL)."""

from __future__ import annotations

import math
import statistics

import pytest

from helpers.reward_tools import (
    RewardCase,
    assert_cases,
    check_cases,
    group_advantages,
    nanstd,
    normalize_rewards,
    score_table,
)
from helpers.rewards import (
    correctness_reward,
    get_preset,
    numeric_answer_reward,
    strict_format_reward,
)

GOOD = "<reasoning>\n2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>"


# --------------------------------------------------------------------------- harness


def test_check_cases_reports_pass_fail_and_missing():
    cases = [
        RewardCase(GOOD, {"correctness_reward": 2.0, "strict_format_reward": 1.0}, answer="4", note="good"),
        RewardCase("<answer>5</answer>", {"correctness_reward": 2.0}, answer="4", note="wrong on purpose"),
        RewardCase(GOOD, {"typo_reward": 1.0}, note="unknown reward"),
        RewardCase("<answer>x</answer>", {"numeric_answer_reward": None}, note="None expected, 0.0 got"),
    ]
    t = check_cases(cases, [correctness_reward, strict_format_reward, numeric_answer_reward])
    assert list(t.columns) == ["case", "note", "completion", "reward", "expected", "got", "passed"]
    assert t["passed"].tolist() == [True, True, False, False, False]
    assert t.loc[3, "got"] == "missing"
    with pytest.raises(AssertionError, match="3 of 5 reward checks failed") as err:
        assert_cases(cases, [correctness_reward, strict_format_reward, numeric_answer_reward])
    assert "wrong on purpose" in str(err.value) and "typo_reward" in str(err.value)


def test_check_cases_shows_a_raising_reward_as_failed():
    def raw(prompts=None, completions=None, **kw):
        raise KeyError("answer")

    raw.__name__ = "raw_reward"
    t = check_cases([RewardCase("x", {"raw_reward": 1.0})], [raw])
    assert not t["passed"].any() and "raised KeyError" in t.loc[0, "got"]


def test_check_cases_passes_extra_columns_and_ids():
    def col_reward(completions, completion_ids=None, level=None, **kw):
        return [float(len(i)) + (10.0 if lv == "hard" else 0.0) for i, lv in zip(completion_ids, level)]

    t = check_cases([RewardCase("x", {"col_reward": 13.0}, completion_ids=[1, 2, 3], columns={"level": "hard"})],
                    [col_reward])
    assert t["passed"].all()


def test_normalize_rewards_forms_and_duplicate_names():
    assert [n for n, _, _ in normalize_rewards(correctness_reward)] == ["correctness_reward"]
    assert [w for _, _, w in normalize_rewards([(correctness_reward, 0.5)])] == [0.5]
    assert [n for n, _, _ in normalize_rewards({"mine": strict_format_reward})] == ["mine"]
    with pytest.raises(ValueError, match="share the name"):
        normalize_rewards([correctness_reward, correctness_reward])
    with pytest.raises(TypeError, match="get_preset"):
        normalize_rewards([42])


# --------------------------------------------------------------------------- score_table


def test_score_table_columns_and_weighted_total():
    comps = [GOOD, [{"role": "assistant", "content": "<answer>5</answer>"}], "nothing"]
    t = score_table(comps, [(correctness_reward, 1.0), (numeric_answer_reward, 0.5), (strict_format_reward, 2.0)],
                    answer=["4", "4", "4"])
    assert list(t.columns) == ["completion", "answer", "correctness_reward", "numeric_answer_reward",
                               "strict_format_reward", "total"]
    assert t["total"].tolist() == [2.0 + 0.25 + 2.0, 0.25, 0.0]
    assert t["completion"][1] == "<answer>5</answer>"


def test_score_table_none_is_skipped_like_trl():
    def sometimes(completions, **kw):
        return [None, 1.0]

    def never(completions, **kw):
        return [None, None]

    sometimes.__name__, never.__name__ = "sometimes_reward", "never_reward"
    t = score_table(["a", "b"], [sometimes])
    assert math.isnan(t["sometimes_reward"][0]) and math.isnan(t["total"][0]) and t["total"][1] == 1.0
    t2 = score_table(["a", "b"], [(sometimes, 1.0), (correctness_reward, 1.0)], answer=["1", "1"])
    assert t2["total"].tolist() == [0.0, 1.0]  # nansum: the None is skipped, not NaN
    assert math.isnan(score_table(["a", "b"], [never])["total"][1])


def test_score_table_errors_name_the_problem():
    with pytest.raises(ValueError, match="Column 'answer' has 1 values but there are 2"):
        score_table(["a", "b"], [correctness_reward], answer=["1"])

    def bad(completions, **kw):
        raise RuntimeError("boom")

    bad.__name__ = "bad_reward"
    with pytest.raises(RuntimeError, match="'bad_reward' raised RuntimeError"):
        score_table(["a"], [bad])


def test_score_table_with_a_preset_and_prefilled_prompts():
    prompt = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<reasoning>\n"}]
    t = score_table(["2 + 2 = 4\n</reasoning>\n<answer>\n4\n</answer>"], get_preset("arithmetic"),
                    prompts=[prompt], answer=["4"])
    assert t.loc[0, "prefilled_strict_format_reward"] == 1.0
    assert t.loc[0, "total"] == 2.0 * 1.0 + 1.0 * 0.5 + 1.0 * 0.5 + 1.0 * 0.25


# --------------------------------------------------------------------------- advantages


def test_group_advantages_by_hand():
    r = [1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0]
    a = group_advantages(r, group_size=4)
    std = statistics.stdev([1.0, 0.0, 0.0, 0.0])  # Bessel-corrected, like TRL
    assert a.advantages[:4] == pytest.approx([0.75 / (std + 1e-4), -0.25 / (std + 1e-4)] + [-0.25 / (std + 1e-4)] * 2,
                                             rel=1e-5)
    assert a.advantages[4:] == [0.0] * 4
    assert a.zero_std == [False] * 4 + [True] * 4 and a.frac_zero_std == 0.5
    assert a.group_mean == [0.25, 2.0]
    none = group_advantages(r, 4, scale="none")
    assert none.advantages == pytest.approx([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0])
    batch = group_advantages(r, 4, scale="batch")
    bstd = statistics.stdev(r)
    assert batch.advantages[0] == pytest.approx(0.75 / (bstd + 1e-4), rel=1e-5)
    assert batch.frac_zero_std == 0.0  # the batch std is not zero
    frame = a.to_frame()
    assert list(frame.columns) == ["group", "reward", "group_mean", "std_used", "advantage"]


def test_group_advantages_per_function_matrix_and_none():
    per_func = [[2.0, 1.0], [0.0, None], [None, None], [0.0, 0.0]]
    a = group_advantages(per_func, group_size=2, weights=[1.0, 0.5])
    assert a.rewards[:2] == [2.5, 0.0]
    assert math.isnan(a.rewards[2]) and a.rewards[3] == 0.0
    assert a.advantages[2] == 0.0 and a.advantages[3] == 0.0  # unscorable: advantage forced to 0
    assert a.zero_std[2] is False  # std of one value is NaN, and NaN is not "close to 0" (TRL's logging)


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages([1, 2, 3, 4], 3)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages([1, 2], 2, scale="max")


@pytest.mark.slow
def test_nanstd_and_advantages_match_trl_trainer(tmp_path):
    """Run TRL's own GRPOTrainer scoring step on a tiny model and compare advantages."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import nanstd as trl_nanstd

    from helpers.models import bundled_model_path

    x = torch.tensor([[1.0, float("nan"), 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]])
    assert torch.allclose(nanstd(x, dim=1), trl_nanstd(x, dim=1), equal_nan=True)
    assert torch.allclose(nanstd(x), trl_nanstd(x))

    tok = AutoTokenizer.from_pretrained(bundled_model_path(build=False))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         pad_token_id=tok.pad_token_id))
    G = 4
    # scripted scores per completion (two reward functions, some None), one batch = 3 groups of 4
    script_a = [1.0, 0.0, 0.0, 2.0, 1.0, 1.0, 1.0, 1.0, 0.0, None, 3.0, 0.5]
    script_b = [0.5, 0.5, None, 0.0, 0.0, 0.0, 0.0, 0.0, None, None, 1.0, 0.0]

    def a_reward(completions, **kw):
        return script_a[: len(completions)]

    def b_reward(completions, **kw):
        return script_b[: len(completions)]

    from helpers.rewards import strict_format_reward

    weights = [1.0, 2.0, 0.0]  # a course reward (an object, not a function) rides along with weight 0
    for scale in ("group", "batch", "none"):
        args = GRPOConfig(output_dir=str(tmp_path / scale), num_generations=G, per_device_train_batch_size=12,
                          max_completion_length=3, report_to=[], use_cpu=True, scale_rewards=scale,
                          reward_weights=weights, logging_steps=1, bf16=False)
        ds = Dataset.from_list([{"prompt": f"Q{i}"} for i in range(3)])
        trainer = GRPOTrainer(model=model, reward_funcs=[a_reward, b_reward, strict_format_reward], args=args,
                              train_dataset=ds, processing_class=tok)
        trainer.model.train()
        inputs = [{"prompt": f"Q{i // G}"} for i in range(3 * G)]
        out = trainer._generate_and_score_completions(inputs)
        trl_adv = out["advantages"].tolist()
        mine = group_advantages([[a, b, 0.0] for a, b in zip(script_a, script_b)], G, scale=scale, weights=weights)
        assert mine.advantages == pytest.approx(trl_adv, abs=1e-6), scale
        assert trainer._metrics["train"]["frac_reward_zero_std"][-1] == pytest.approx(mine.frac_zero_std)
        assert trainer._metrics["train"]["rewards/strict_format_reward/mean"][-1] == 0.0  # logged by __name__


# --------------------------------------------------------------------------- plots and playground


def test_plot_reward_distributions_and_show_figure(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from helpers.reward_tools import plot_reward_distributions, show_figure

    t = score_table([GOOD, "<answer>5</answer>", "x"], [correctness_reward, numeric_answer_reward],
                    answer=["4", "4", "4"])
    fig = plot_reward_distributions(t, title="demo")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["correctness", "numeric_answer", "total"]
    assert sum(p.get_height() for p in fig.axes[0].patches) == 3  # every completion counted once
    out = tmp_path / "figs" / "r.png"
    show_figure(fig, out)
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_reward_playground_updates_and_prints_static_table(capsys):
    from helpers.reward_tools import reward_playground

    box = reward_playground([correctness_reward, strict_format_reward], text=GOOD, answer="4")
    printed = capsys.readouterr().out
    assert "correctness_reward" in printed and "2.000" in printed  # headless fallback
    gold, text, out = box.children
    text.value = "<answer>4</answer>"  # typing re-scores; outside a kernel the Output widget prints to stdout
    lines = {ln.split()[0]: ln.split()[-1] for ln in capsys.readouterr().out.splitlines() if len(ln.split()) == 2}
    assert lines["correctness_reward"] == "2.000" and lines["strict_format_reward"] == "0.000"
    gold.value = "5"
    lines = {ln.split()[0]: ln.split()[-1] for ln in capsys.readouterr().out.splitlines() if len(ln.split()) == 2}
    assert lines["correctness_reward"] == "0.000"
