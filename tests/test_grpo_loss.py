"""helpers.grpo_loss: the GRPO loss by hand equals TRL 1.13's ``GRPOTrainer.compute_loss``, loss type by loss type.

The fast tests check the pieces on numbers worked out by hand, and that every input TRL's loss reads is either
modelled or refused by name. The slow ones catch one real batch from a short ``GRPOTrainer`` run on the bundled
model, in float32 (off-policy, with a KL term, so that the batch carries old and reference log-probs and the
ratio is not 1), then compare, for every ``loss_type`` TRL has, GSPO and the knobs around them, the hand loss
with TRL's on that batch: the loss (the module's own formulation to ``LOSS_ATOL``, exact in float32), the LoRA
gradient (``relative_gap`` within ``GRAD_RTOL``) and the metrics TRL logs. A mutation check keeps the tolerance a
learner's loss is held to (``close``, ``GRAD_RTOL``) honest: an equivalent formulation passes, and each of a set of
deliberately wrong hand losses fails.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import pytest
import torch

import helpers.grpo_loss as hl
from helpers.grpo_loss import (GRAD_RTOL, LOSS_ATOL, LOSS_TYPES, UNMODELLED, Captured, LossSettings, UnmodelledOption,
                               aggregate, close, clipped_surrogate, completion_logps, grpo_loss, importance_ratio,
                               k3_kl, load_weights, lora_grads, relative_gap)


class CaptureLoss:
    """Notebook 06's capturing trainer as a mixin, first in the bases: keeps each micro-step in ``self.captured``
    (trl/trainer/grpo_trainer.py:3028-3035), with its generation batch's rewards and advantages (``_logs``,
    2860-2863)."""

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
            {k: v[-1] for k, v in self._metrics["train"].items() if len(v) > logged.get(k, 0)},
            {name: list(values) for name, values in self._logs["rewards"].items()}, list(self._logs["advantages"])))
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


#: What TRL's _compute_loss reads from the trainer and its args, and where the hand loss stands on each.
MODELLED = {"loss_type", "importance_sampling_level", "epsilon_low", "epsilon_high", "delta", "beta",
            "use_bias_correction_kl", "max_completion_length", "sapo_temperature_pos", "sapo_temperature_neg",
            "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "use_vllm",
            "vllm_importance_sampling_correction", "steps_per_generation", "current_gradient_accumulation_steps",
            "accelerator",  # num_processes
            "model", "_metrics", "_get_per_token_logps_and_entropies", "get_gamma_weights"}
REFUSED = {name for name, *_ in UNMODELLED} | {
    "get_high_entropy_mask", "get_off_policy_mask", "_entropy_bonus_enabled", "_entropy_window_stats",
    "_last_world_entropy", "entropy_coef_delta", "entropy_coef_max", "entropy_coef_min", "entropy_target",
    "aux_loss_enabled", "router_aux_loss_coef"}  # the last two: Mixture-of-Experts models only
#: The batch keys it reads: modelled, refused (tool_mask), or only for other models / unmodelled options.
BATCH_KEYS = {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "old_per_token_logps",
              "ref_per_token_logps", "num_items_in_batch", "importance_sampling_ratio", "tool_mask",
              "sampling_per_token_logps",  # off_policy_mask_threshold only
              "pixel_values", "image_grid_thw", "image_position_ids", "image_sizes", "mm_token_type_ids",
              "num_images", "num_tiles", "pixel_attention_mask", "spatial_shapes", "token_type_ids"}  # vision models


def test_every_input_of_trls_loss_is_modelled_or_refused_by_name():
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._compute_loss)
    read = set(re.findall(r"self\.args\.(\w+)", source)) | set(re.findall(r"self\.(?!args\.)(\w+)", source))
    assert read <= MODELLED | REFUSED, f"TRL's loss reads {sorted(read - MODELLED - REFUSED)}: model or refuse them"
    keys = set(re.findall(r'inputs(?:\.get\(|\[)"(\w+)"', source))
    assert keys <= BATCH_KEYS, f"TRL's loss reads batch keys {sorted(keys - BATCH_KEYS)}"


@pytest.mark.parametrize("name, default, what, lines", UNMODELLED, ids=[u[0] for u in UNMODELLED])
def test_settings_refuse_an_option_they_do_not_model_by_name(name, default, what, lines):
    from trl import GRPOConfig

    value = {None: 0.5, 1.0: 0.2, 0.0: 0.1, False: True}[default]
    config = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, report_to="none", **{name: value})
    with pytest.raises(UnmodelledOption, match=rf"{name}={value!r}.*{what}"):
        LossSettings.from_config(config)


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


def test_on_policy_k3_gives_the_forward_kl_gradient_and_times_the_ratio_the_reverse():
    """grpo_config.py:350-356: the ratio changes the KL gradient on-policy too. Exact expectation on a categorical."""
    theta = torch.tensor([0.3, -1.0, 0.8, 0.0], requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.5, -0.5, 1.0]), -1)

    def expected_grad(with_ratio: bool) -> torch.Tensor:
        logp = torch.log_softmax(theta, -1)
        ratio = torch.exp(logp - logp.detach())  # 1, with the gradient of log pi
        per_token = k3_kl(logp, ref) * (ratio if with_ratio else 1.0)
        return torch.autograd.grad((logp.exp().detach() * per_token).sum(), theta)[0]  # E over x ~ pi (sampled)

    logp = torch.log_softmax(theta, -1)
    reverse = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta)[0]  # KL(pi || ref)
    logp = torch.log_softmax(theta, -1)
    forward = torch.autograd.grad((ref.exp() * (ref - logp)).sum(), theta)[0]  # KL(ref || pi)
    assert torch.allclose(expected_grad(True), reverse, atol=1e-6)
    assert torch.allclose(expected_grad(False), forward, atol=1e-6)
    assert not torch.allclose(forward, reverse, atol=1e-2)


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


def test_dapos_normaliser_is_the_per_process_average_of_the_generation_batch():
    """grpo_trainer.py:3263: num_items_in_batch (gathered over processes) / num_processes."""
    tokens, mask = torch.ones(1, 4), torch.ones(1, 4)
    one = aggregate(tokens, mask, LossSettings(loss_type="dapo"), num_items_in_batch=16)
    two = aggregate(tokens, mask, LossSettings(loss_type="dapo", num_processes=2), num_items_in_batch=16)
    assert (one.item(), two.item()) == (0.25, 0.5)


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
    assert s.vllm_is_correction is False  # vllm_importance_sampling_correction is True by default, use_vllm is not
    assert LossSettings.from_config(config, grad_accum=1).grad_accum == 1
    with_vllm = GRPOConfig(output_dir="/tmp/unused", use_cpu=True, use_vllm=True, report_to="none")
    assert LossSettings.from_config(with_vllm).vllm_is_correction is True
    with pytest.raises(ValueError, match="TRL 1.13 knows"):
        LossSettings(loss_type="ppo")


def test_values_are_close_within_an_absolute_floor_and_a_relative_share():
    assert close(0.0, 9e-7) and not close(0.0, 2e-6)
    assert close(1.00009, 1.0) and not close(1.0002, 1.0)


def test_the_relative_gap_is_a_norm_over_all_tensors():
    a = {"x": torch.tensor([3.0, 0.0]), "y": torch.tensor([4.0])}
    b = {"x": torch.tensor([3.0, 0.5]), "y": torch.tensor([4.0])}
    assert relative_gap(b, a) == pytest.approx(0.1)
    assert relative_gap(a, a) == 0.0


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
#: log-probs and the second step is off-policy), a KL term (reference log-probs), a temperature to divide by,
#: float32 throughout (bf16=False: TRL's default bf16=True would leave the model's forward under bf16 autocast).
CAPTURE = dict(num_generations=4, per_device_train_batch_size=2, gradient_accumulation_steps=2, steps_per_generation=4,
               max_completion_length=16, temperature=0.9, beta=0.04, epsilon=0.2, epsilon_high=0.28,
               learning_rate=1e-3, max_steps=2, loss_type="dapo", lr_scheduler_type="constant", optim="adamw_torch",
               logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=3407,
               bf16=False)
#: What vLLM's default correction (vllm_importance_sampling_mode="sequence_mask") attaches to a batch of 2: one
#: ratio per sequence; 0 where the ratio left [clip_min, clip_max] (grpo_trainer.py:2681-2731, 2933-2934).
IS_RATIO = torch.tensor([[1.3], [0.0]])
#: GRPOConfig changes: every loss type, GSPO, and the knobs around them ("batch" cases change the batch too).
CASES = {
    "grpo": dict(loss_type="grpo"), "bnpo": dict(loss_type="bnpo"), "dr_grpo": dict(loss_type="dr_grpo"),
    "dapo": dict(loss_type="dapo"), "cispo": dict(loss_type="cispo", epsilon_high=5.0),
    "cispo, epsilon_high unset": dict(loss_type="cispo", epsilon_high=None), "sapo": dict(loss_type="sapo"),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence"), "vespo": dict(loss_type="vespo"),
    "GSPO": dict(loss_type="grpo", importance_sampling_level="sequence"),
    "GSPO, its own clip": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4,
                               epsilon_high=4e-4),
    "grpo, delta": dict(loss_type="grpo", delta=1.05), "grpo, no KL": dict(loss_type="grpo", beta=0.0),
    "dapo, no KL correction": dict(loss_type="dapo", use_bias_correction_kl=False),
    "grpo, on-policy": dict(loss_type="grpo", beta=0.0, batch="on-policy"),
    "dapo, vLLM IS": dict(loss_type="dapo", batch="vllm"), "vespo, vLLM IS": dict(loss_type="vespo", batch="vllm"),
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

    def batch(self, kind: str | None) -> dict:
        batch = dict(self.step.batch)
        if kind == "on-policy":  # as if one generation batch fed one optimizer step
            batch.pop("old_per_token_logps")
        elif kind == "vllm":
            batch["importance_sampling_ratio"] = IS_RATIO
        return batch

    def trl(self, changes: dict):
        """TRL's loss, LoRA gradient and logged metrics on the captured micro-batch, under CAPTURE + changes."""
        from trl import GRPOTrainer

        changes = dict(changes)
        kind = changes.pop("batch", None)
        if "ref" in self.model.peft_config:  # a beta > 0 trainer adds a "ref" adapter, and refuses a second one
            self.model.delete_adapter("ref")
        trainer = GRPOTrainer(model=self.model, processing_class=self.tokenizer, reward_funcs=self.funcs,
                              args=self.config(**changes), train_dataset=self.train_set)
        trainer.current_gradient_accumulation_steps = self.step.grad_accum
        if kind == "vllm":  # vLLM is not installed here: set the two flags the loss reads (grpo_trainer.py:3239)
            trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
        load_weights(self.model, self.step.weights)
        self.model.train()
        loss = trainer.compute_loss(self.model, self.batch(kind))
        loss.backward()
        return loss.item(), lora_grads(self.model), {k: v[-1] for k, v in trainer._metrics["train"].items() if v}

    def hand(self, changes: dict, tweak=None, policy=None):
        """The same by hand; ``tweak`` rewrites the settings (a mutation), ``policy`` replaces policy_term."""
        changes = dict(changes)
        kind = changes.pop("batch", None)
        settings = LossSettings.from_config(self.config(**changes), grad_accum=self.step.grad_accum)
        settings = dataclasses.replace(settings, vllm_is_correction=kind == "vllm")
        settings = tweak(settings) if tweak else settings
        load_weights(self.model, self.step.weights)
        self.model.train()
        loss, _, metrics = grpo_loss(self.model, self.batch(kind), settings, policy)
        loss.backward()
        return loss.item(), lora_grads(self.model), metrics


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return Lab(tmp_path_factory.mktemp("grpo-loss"))


def agrees(theirs: tuple, ours: tuple) -> list[str]:
    """What differs between TRL's (loss, grads, metrics) and a hand loss's, at the module's tolerances."""
    problems = [] if close(ours[0], theirs[0]) else [f"loss {ours[0]:+.6f} vs TRL {theirs[0]:+.6f}"]
    if relative_gap(ours[1], theirs[1]) > GRAD_RTOL:
        problems.append(f"gradient {relative_gap(ours[1], theirs[1]):.1e} apart")
    return problems + [f"{k} {v} vs {theirs[2][k]}" for k, v in ours[2].items() if not close(v, theirs[2][k])]


TRL: dict = {}


def trl_result(lab, name):
    if name not in TRL:
        TRL[name] = lab.trl(CASES[name])
    return TRL[name]


@pytest.mark.slow
def test_the_capture_ran_in_float32(lab):
    """bf16=False: accelerate did not wrap the model's forward in autocast, and its logits are float32."""
    assert not hasattr(lab.model, "_original_forward")
    with torch.no_grad():
        out = lab.model(input_ids=lab.step.batch["prompt_ids"][:1], attention_mask=lab.step.batch["prompt_mask"][:1])
    assert out.logits.dtype == torch.float32


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
def test_the_generation_batch_rewards_and_advantages_are_kept(lab):
    """The capture keeps the whole generation batch's rewards and TRL's advantages (grpo_trainer.py:2860-2863)."""
    size = CAPTURE["per_device_train_batch_size"] * CAPTURE["steps_per_generation"]
    assert len(lab.step.advantages) == size and len(lab.step.rewards) == len(lab.funcs)
    assert all(len(v) == size for v in lab.step.rewards.values())
    for a in lab.step.batch["advantages"].tolist():  # the micro-batch is a shuffled slice of the generation batch
        assert min(abs(a - b) for b in lab.step.advantages) < 1e-6


@pytest.mark.slow
def test_the_hand_loss_is_the_loss_trl_trained_with(lab):
    load_weights(lab.model, lab.step.weights)
    lab.model.train()
    with torch.no_grad():
        loss, _, metrics = grpo_loss(lab.model, lab.step.batch, LossSettings.from_config(lab.config(), grad_accum=2))
    assert abs(loss.item() - lab.step.loss) <= LOSS_ATOL
    for key in ("kl", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert metrics[key] == pytest.approx(lab.step.metrics[key], abs=1e-6), key


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_the_hand_loss_equals_trls(lab, name):
    theirs, ours = trl_result(lab, name), lab.hand(CASES[name])
    assert not agrees(theirs, ours), agrees(theirs, ours)
    assert abs(theirs[0] - ours[0]) <= LOSS_ATOL  # the same operations in float32: exact, not merely close
    assert max(g.abs().max().item() for g in theirs[1].values()) > 0
    assert set(ours[2]) <= set(theirs[2])


@pytest.mark.slow
def test_the_loss_types_give_different_numbers(lab):
    """Equality is not luck: on this batch every loss type, and GSPO, gives its own loss."""
    names = [*LOSS_TYPES, "GSPO"]
    assert len({round(trl_result(lab, name)[0], 6) for name in names}) == len(names)


@pytest.mark.slow
@pytest.mark.parametrize("name, plain", [("grpo, delta", "grpo"), ("GSPO, its own clip", "GSPO"),
                                         ("dapo, vLLM IS", "dapo"), ("dapo, no KL correction", "dapo")])
def test_each_knob_binds_on_this_batch(lab, name, plain):
    """A knob that changes nothing TRL computes here would let a wrong one pass: each moves the loss or gradient.

    (At micro-step 2 both of GSPO's sequence ratios are below 0.8, so both clip ranges cut the same completion's
    gradient; the clipped term's value, 1 - epsilon, still differs.)"""
    knob, base = trl_result(lab, name), trl_result(lab, plain)
    assert abs(knob[0] - base[0]) > 100 * LOSS_ATOL or relative_gap(knob[1], base[1]) > 100 * GRAD_RTOL


@pytest.mark.slow
def test_the_vllm_ratio_changes_the_loss_but_never_the_clip_metrics(lab):
    """grpo_trainer.py:3239-3240 multiply the token losses; 3365-3376 count clipping on the policy ratio alone."""
    plain, corrected = trl_result(lab, "dapo"), trl_result(lab, "dapo, vLLM IS")
    assert abs(plain[0] - corrected[0]) > 1e-4
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert plain[2][key] == corrected[2][key]


@pytest.mark.slow
def test_gspo_is_grpo_on_policy(lab):
    """With the ratio at exactly 1 (no old log-probs) and no KL, GSPO's loss and gradient are grpo's."""
    token = lab.hand(dict(loss_type="grpo", beta=0.0, batch="on-policy"))
    sequence = lab.hand(dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.0, batch="on-policy"))
    assert token[0] == pytest.approx(sequence[0], abs=1e-6)
    assert relative_gap(sequence[1], token[1]) <= GRAD_RTOL


# --------------------------------------------------------------------------- the tolerance, kept honest


def logps_by_log_softmax(model, batch, temperature=1.0):
    """An equivalent formulation: log_softmax, then gather (other rounding, same loss)."""
    width = batch["completion_ids"].size(1)
    logits = model(input_ids=torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                   attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
                   logits_to_keep=width + 1, use_cache=False).logits[:, :-1, :] / temperature
    return logits.log_softmax(-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dapo", "GSPO", "cispo", "grpo, delta"])
def test_an_equivalent_formulation_passes(lab, name, monkeypatch):
    monkeypatch.setattr(hl, "completion_logps", logps_by_log_softmax)
    assert not agrees(trl_result(lab, name), lab.hand(CASES[name]))


def per_microbatch_tokens(per_token, mask, s, num_items_in_batch=None):
    """dapo normalised by this micro-batch's tokens (bnpo's normaliser) instead of the generation batch's."""
    return (per_token * mask).sum() / mask.sum() / s.grad_accum


def sequence_ratio_over_padding(logps, old_logps, mask, level="token"):
    """GSPO's mean log-ratio taken over every position, padding included."""
    log_ratio = logps - (logps.detach() if old_logps is None else old_logps)
    return torch.exp(log_ratio.mean(-1, keepdim=True)) if level == "sequence" else torch.exp(log_ratio)


def ratio_without_detach(logps, old_logps, mask, level="token"):
    """On-policy, ``old = logps`` instead of ``logps.detach()``: the ratio is 1 and carries no gradient."""
    return torch.exp(logps - (logps if old_logps is None else old_logps))


def cispo_weight_not_detached(ratio, advantages, logps, log_ratio, mask, s, is_ratio=None):
    """cispo with the capped ratio left in the graph: the same value, another gradient."""
    if s.loss_type != "cispo":
        return hl.policy_term(ratio, advantages, logps, log_ratio, mask, s, is_ratio)
    return -torch.clamp(ratio, max=s.epsilon_high) * advantages * logps


#: Deliberately wrong hand losses, each with the case that must catch it: (patched name, replacement, settings
#: rewrite, policy, case).
MUTANTS = {
    "temperature forgotten": (None, None, lambda s: dataclasses.replace(s, temperature=1.0), None, "dapo"),
    "dapo's normaliser of one micro-batch": ("aggregate", per_microbatch_tokens, None, None, "dapo"),
    "GSPO's mean over the padding": ("importance_ratio", sequence_ratio_over_padding, None, None, "GSPO"),
    "on-policy ratio not detached": ("importance_ratio", ratio_without_detach, None, None, "grpo, on-policy"),
    "cispo's weight not detached": (None, None, None, cispo_weight_not_detached, "cispo"),
    "delta ignored": (None, None, lambda s: dataclasses.replace(s, delta=None), None, "grpo, delta"),
    "epsilons swapped": (None, None, lambda s: dataclasses.replace(s, epsilon_low=s.epsilon_high,
                                                                   epsilon_high=s.epsilon_low), None, "grpo"),
    "KL without the ratio": (None, None, lambda s: dataclasses.replace(s, use_bias_correction_kl=False), None, "dapo"),
    "vLLM ratio ignored": (None, None, lambda s: dataclasses.replace(s, vllm_is_correction=False), None,
                           "dapo, vLLM IS"),
    "steps_per_generation ignored": (None, None, lambda s: dataclasses.replace(s, steps_per_generation=1), None,
                                     "dapo"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_a_wrong_hand_loss_fails(lab, mutant, monkeypatch):
    name, replacement, tweak, policy, case = MUTANTS[mutant]
    if name:
        monkeypatch.setattr(hl, name, replacement)
    assert agrees(trl_result(lab, case), lab.hand(CASES[case], tweak=tweak, policy=policy)), f"{mutant} passed"
