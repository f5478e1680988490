"""helpers.grpo_loss: the GRPO loss by hand equals TRL 1.13's ``GRPOTrainer.compute_loss``, loss type by loss type.

The fast tests check the pieces on numbers worked out by hand. The slow ones catch one real batch from a
short ``GRPOTrainer`` run on the bundled model (off-policy, with a KL term, so that the batch carries old and
reference log-probs and the ratio is not 1), then compare, for every ``loss_type`` TRL has and GSPO, the
hand loss with TRL's on that batch: the loss, the LoRA gradient and the metrics TRL logs.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import torch

from helpers.grpo_loss import (LOSS_TYPES, Captured, LossSettings, aggregate, clipped_surrogate, completion_logps,
                               grpo_loss, importance_ratio, k3_kl, load_weights, lora_grads)


class CaptureLoss:
    """Notebook 06's capturing trainer as a mixin, first in the bases: keeps each micro-step in ``self.captured``
    (trl/trainer/grpo_trainer.py:3027-3035)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.captured: list[Captured] = []

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        if not model.training:  # an evaluation pass: nothing to keep
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        logged = {k: len(v) for k, v in self._metrics["train"].items()}
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.captured.append(Captured(
            len(self.captured), {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in inputs.items()},
            loss.item(), weights, self.current_gradient_accumulation_steps,
            {k: v[-1] for k, v in self._metrics["train"].items() if len(v) > logged.get(k, 0)}))
        return loss


# --------------------------------------------------------------------------- the pieces, by hand


def test_the_loss_types_are_all_of_trls():
    """Every loss_type string TRL's _compute_loss tests for is in LOSS_TYPES, and nothing else."""
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._compute_loss)
    named = set(re.findall(r'loss_type == "(\w+)"', source))
    for group in re.findall(r"loss_type in \[([^\]]+)\]", source):
        named |= set(re.findall(r'"(\w+)"', group))
    assert named == set(LOSS_TYPES)


def test_the_clip_stops_the_gradient_only_in_the_direction_the_advantage_pushes():
    r = torch.tensor([0.5, 0.9, 1.0, 1.2, 1.5], requires_grad=True)
    up = clipped_surrogate(r, torch.tensor(1.0), 0.2, 0.28)
    assert up.tolist() == pytest.approx([-0.5, -0.9, -1.0, -1.2, -1.28])
    assert torch.autograd.grad(up.sum(), r)[0].tolist() == [-1.0, -1.0, -1.0, -1.0, 0.0]
    down = clipped_surrogate(r, torch.tensor(-1.0), 0.2, 0.28)
    assert down.tolist() == pytest.approx([0.8, 0.9, 1.0, 1.2, 1.5])
    assert torch.autograd.grad(down.sum(), r)[0].tolist() == [0.0, 1.0, 1.0, 1.0, 1.0]
    capped = clipped_surrogate(torch.tensor([3.0]), torch.tensor(-1.0), 0.2, 0.28, delta=2.0)
    assert capped.tolist() == [2.0]  # two-sided clipping: delta caps the unclipped ratio


def test_k3_is_never_negative_and_zero_where_the_policies_agree():
    d = torch.linspace(-3, 3, 61)
    kl = k3_kl(torch.zeros_like(d), d)
    assert (kl >= 0).all() and kl[30] == 0.0
    assert kl[31].item() == pytest.approx(0.1 ** 2 / 2, rel=0.05)  # ~ d^2 / 2 near 0


def test_the_on_policy_ratio_is_one_and_keeps_the_gradient():
    logps = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    for level in ("token", "sequence"):
        ratio = importance_ratio(logps, None, mask, level)
        assert torch.equal(ratio, torch.ones_like(ratio))
        (grad,) = torch.autograd.grad((ratio * mask if level == "token" else ratio).sum(), logps)
        assert grad.tolist() == ([[1.0, 1.0, 0.0]] if level == "token" else [[0.5, 0.5, 0.0]])
    old = torch.tensor([[-1.5, -2.0, -9.0]])
    assert importance_ratio(logps, old, mask, "sequence").item() == pytest.approx(torch.exp(torch.tensor(0.25)).item())


#: A short right completion (2 tokens, token loss -1) and a long wrong one (6 tokens, +1); max length 8, no accumulation.
TOY = {"grpo": 0.0, "sapo": 0.0, "bnpo": 0.5, "dr_grpo": 0.25, "dapo": 0.5, "cispo": 0.5, "vespo": 0.5, "luspo": 2.0}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_each_loss_type_reduces_the_toy_batch_as_trl_documents(loss_type):
    mask = torch.tensor([[1.0] * 2 + [0.0] * 4, [1.0] * 6])
    tokens = torch.tensor([[-1.0] * 6, [1.0] * 6])
    s = LossSettings(loss_type=loss_type, max_completion_length=8)
    assert aggregate(tokens, mask, s, num_items_in_batch=8).item() == pytest.approx(TOY[loss_type])
    # gradient accumulation: TRL divides by it; dapo's window also scales with steps_per_generation
    halved = LossSettings(loss_type=loss_type, max_completion_length=8, grad_accum=2)
    assert aggregate(tokens, mask, halved, num_items_in_batch=8).item() == pytest.approx(TOY[loss_type] / 2)


def test_dapo_needs_the_generation_batch_token_count():
    with pytest.raises(ValueError, match="num_items_in_batch"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), LossSettings(loss_type="dapo"))


def test_settings_read_a_config_as_trl_does():
    from trl import GRPOConfig

    config = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, loss_type="cispo", epsilon=0.3, temperature=0.7,
                        gradient_accumulation_steps=4, report_to="none")
    s = LossSettings.from_config(config)
    assert (s.loss_type, s.epsilon_low, s.epsilon_high, s.temperature, s.grad_accum) == ("cispo", 0.3, 0.3, 0.7, 4)
    assert s.steps_per_generation == 4  # TRL's default: gradient_accumulation_steps
    assert LossSettings.from_config(config, grad_accum=1).grad_accum == 1
    with pytest.raises(ValueError, match="TRL 1.13 knows"):
        LossSettings(loss_type="ppo")


def test_saved_weights_go_back_into_the_model_and_others_are_refused():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[1].weight.requires_grad_(False)
    saved = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        model[0].weight.add_(1.0)
    load_weights(model, saved)
    assert torch.equal(model[0].weight, saved["0.weight"])
    with pytest.raises(KeyError, match="not weights of this model"):
        load_weights(model, {"lora_A.weight": torch.zeros(1)})


# --------------------------------------------------------------------------- against TRL, on a real batch

#: The run a batch is caught from: one generation batch over two optimizer steps (so TRL records old
#: log-probs and the second step is off-policy), a KL term (reference log-probs), a temperature to divide by.
CAPTURE = dict(num_generations=4, per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=4,
               max_completion_length=16, temperature=0.9, beta=0.04, epsilon=0.2, epsilon_high=0.28,
               learning_rate=1e-3, max_steps=2, loss_type="dapo", lr_scheduler_type="constant", optim="adamw_torch",
               logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=3407)
#: GRPOConfig changes: every loss type, GSPO, and the knobs around them.
CASES = {
    "grpo": dict(loss_type="grpo"), "bnpo": dict(loss_type="bnpo"), "dr_grpo": dict(loss_type="dr_grpo"),
    "dapo": dict(loss_type="dapo"), "cispo": dict(loss_type="cispo", epsilon_high=5.0),
    "cispo, epsilon_high unset": dict(loss_type="cispo", epsilon_high=None), "sapo": dict(loss_type="sapo"),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence"), "vespo": dict(loss_type="vespo"),
    "GSPO": dict(loss_type="grpo", importance_sampling_level="sequence"),
    "grpo, delta": dict(loss_type="grpo", delta=1.5), "grpo, no KL": dict(loss_type="grpo", beta=0.0),
    "dapo, no KL correction": dict(loss_type="dapo", use_bias_correction_kl=False),
}


class Lab:
    """The bundled model, its data and rewards, and one captured off-policy micro-batch."""

    def __init__(self, folder):
        from transformers import PrinterCallback
        from trl import GRPOConfig, GRPOTrainer

        from helpers.data import ensure_prepared
        from helpers.models import load_model
        from helpers.profiles import get_profile
        from helpers.tasks import get_task

        profile = get_profile("cpu-smoke")
        self.model, self.tokenizer = load_model(profile)
        self.train_set = ensure_prepared(profile, folder, tokenizer=self.tokenizer, verbose=False)["train"]
        rewards = get_task(profile.task).rewards_for(profile.task_level)
        self.funcs, self.base = [f for f, _ in rewards], dict(CAPTURE, output_dir=str(folder / "grpo"),
                                                              reward_weights=[w for _, w in rewards])
        self.config = lambda **changes: GRPOConfig(**{**self.base, **changes})  # noqa: E731

        class CapturingGRPOTrainer(CaptureLoss, GRPOTrainer):
            pass

        trainer = CapturingGRPOTrainer(model=self.model, processing_class=self.tokenizer, reward_funcs=self.funcs,
                                       args=self.config(), train_dataset=self.train_set)
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        self.captured = trainer.captured
        self.step = trainer.captured[2]  # the first micro-step of the second optimizer step: off-policy

    def trl(self, changes: dict):
        """TRL's loss, LoRA gradient and logged metrics on the captured micro-batch, under CAPTURE + changes."""
        from trl import GRPOTrainer

        if "ref" in self.model.peft_config:  # a beta > 0 trainer adds a "ref" adapter, and refuses a second one
            self.model.delete_adapter("ref")
        trainer = GRPOTrainer(model=self.model, processing_class=self.tokenizer, reward_funcs=self.funcs,
                              args=self.config(**changes), train_dataset=self.train_set)
        trainer.current_gradient_accumulation_steps = self.step.grad_accum
        load_weights(self.model, self.step.weights)
        self.model.train()
        loss = trainer.compute_loss(self.model, self.step.batch)
        loss.backward()
        return loss.item(), lora_grads(self.model), {k: v[-1] for k, v in trainer._metrics["train"].items() if v}

    def hand(self, changes: dict, batch: dict | None = None):
        settings = LossSettings.from_config(self.config(**changes), grad_accum=self.step.grad_accum)
        load_weights(self.model, self.step.weights)
        self.model.train()
        loss, _, metrics = grpo_loss(self.model, self.step.batch if batch is None else batch, settings)
        loss.backward()
        return loss.item(), lora_grads(self.model), metrics


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return Lab(tmp_path_factory.mktemp("grpo-loss"))


def largest(grads: dict) -> float:
    return max(g.abs().max().item() for g in grads.values())


def gap(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.slow
def test_the_captured_batch_is_complete_and_off_policy(lab):
    batch = lab.step.batch
    assert {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
            "ref_per_token_logps", "num_items_in_batch"} <= set(batch)
    assert [c.grad_accum for c in lab.captured] == [2, 2, 2, 2]
    assert int(batch["num_items_in_batch"]) > int(batch["completion_mask"].sum())  # the whole generation batch
    assert (batch["advantages"] != 0).any()
    mask = batch["completion_mask"].bool()
    load_weights(lab.model, lab.captured[0].weights)  # the weights the generation batch was sampled with
    with torch.no_grad():
        sampled = completion_logps(lab.model, batch, CAPTURE["temperature"])
        load_weights(lab.model, lab.step.weights)
        now = completion_logps(lab.model, batch, CAPTURE["temperature"])
    assert (sampled - batch["old_per_token_logps"])[mask].abs().max() <= 1e-5
    assert (now - batch["old_per_token_logps"])[mask].abs().max() > 0.05  # the ratio really left 1


@pytest.mark.slow
def test_the_hand_loss_is_the_loss_trl_trained_with(lab):
    load_weights(lab.model, lab.step.weights)
    lab.model.train()
    with torch.no_grad():
        loss, _, metrics = grpo_loss(lab.model, lab.step.batch, LossSettings.from_config(lab.config(), grad_accum=2))
    assert abs(loss.item() - lab.step.loss) <= 1e-5
    for key in ("kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert metrics[key] == pytest.approx(lab.step.metrics[key], abs=1e-6), key


RESULTS: dict = {}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_the_hand_loss_equals_trls(lab, name):
    theirs, their_grads, their_metrics = lab.trl(CASES[name])
    ours, our_grads, our_metrics = lab.hand(CASES[name])
    RESULTS[name] = theirs
    assert abs(theirs - ours) <= 1e-5, (theirs, ours)
    assert gap(their_grads, our_grads) <= 1e-5 * largest(their_grads)
    assert largest(their_grads) > 0
    for key, value in our_metrics.items():
        assert value == pytest.approx(their_metrics[key], abs=1e-6), key


@pytest.mark.slow
def test_the_loss_types_give_different_numbers(lab):
    """Equality is not luck: on this batch every loss type, and GSPO, gives its own loss."""
    names = [*LOSS_TYPES, "GSPO"]
    for name in names:
        RESULTS.setdefault(name, lab.trl(CASES[name])[0])
    assert len({round(RESULTS[name], 6) for name in names}) == len(names)


@pytest.mark.slow
def test_gspo_is_grpo_on_policy(lab):
    """With the ratio at exactly 1 (no old log-probs) and no KL, GSPO's loss and gradient are grpo's."""
    on_policy = {k: v for k, v in lab.step.batch.items() if k != "old_per_token_logps"}
    token = lab.hand(dict(loss_type="grpo", beta=0.0), on_policy)
    sequence = lab.hand(dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.0), on_policy)
    assert token[0] == pytest.approx(sequence[0], abs=1e-6)
    assert gap(token[1], sequence[1]) <= 1e-5 * largest(token[1])
