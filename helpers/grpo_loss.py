"""Notebook 06's save point: TRL 1.13's GRPO loss in plain torch (trl/trainer/grpo_trainer.py:3113-3383).

Example:
    >>> s = LossSettings(loss_type="bnpo")
    >>> float(aggregate(torch.tensor([[1.0, 3.0]]), torch.ones(1, 2), s))
    2.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch

#: Every ``loss_type`` TRL 1.13 accepts (trl/trainer/grpo_trainer.py:3202-3231, 3246-3277).
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
#: The loss types built on PPO's clipped surrogate (trl/trainer/grpo_trainer.py:3205).
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
#: How far a hand loss's LoRA gradient may be from TRL's, as ``relative_gap`` measures it: float32 rounding of
#: an equivalent formulation (``log_softmax().gather()``: ~3e-5 of the largest entry) passes, a real bug does not.
GRAD_RTOL = 1e-4
#: How far a hand loss's value (or a logged metric) may be from TRL's: ``LOSS_ATOL + VALUE_RTOL * |TRL's|``. The
#: same formulation lands exactly on it in float32; ``log_softmax().gather()`` moves cispo's loss by ~7e-6 of it.
LOSS_ATOL = 1e-6
VALUE_RTOL = 1e-4

#: ``GRPOConfig`` options that change ``_compute_loss`` and that this module does not model: (field, value that
#: leaves the loss alone, what it does, TRL's line). :meth:`LossSettings.from_config` refuses any other value.
UNMODELLED = (
    ("top_entropy_quantile", 1.0, "masks all but the highest-entropy tokens", "3142-3145, 3236-3237"),
    ("off_policy_mask_threshold", None, "drops off-policy sequences with negative advantages", "3161-3174, 3233-3234"),
    ("entropy_coef", 0.0, "adds an entropy bonus", "3282-3338"),
    ("use_adaptive_entropy", False, "adds an adaptive entropy bonus", "3282-3338"),
    ("use_liger_kernel", False, "replaces the loss with Liger's fused kernel", "3031-3034"),
)


class UnmodelledOption(ValueError):
    """A ``GRPOConfig`` sets an option the hand loss does not compute: its loss would not be TRL's."""


@dataclass(frozen=True)
class LossSettings:
    """The ``GRPOConfig`` values the loss reads, and the trainer's ``current_gradient_accumulation_steps``.

    ``vllm_is_correction`` is ``use_vllm and vllm_importance_sampling_correction``: the per-token loss is then
    multiplied by the batch's ``importance_sampling_ratio`` (trl/trainer/grpo_trainer.py:3239-3240)."""

    loss_type: str = "dapo"
    importance_sampling_level: str = "token"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    temperature: float = 1.0
    max_completion_length: int = 256
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    vllm_is_correction: bool = False
    grad_accum: int = 1
    steps_per_generation: int = 1
    num_processes: int = 1

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r}: TRL 1.13 knows {', '.join(LOSS_TYPES)}.")
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(f"importance_sampling_level={self.importance_sampling_level!r}: "
                             "use 'token' or 'sequence'.")

    @classmethod
    def from_config(cls, config: Any, grad_accum: int | None = None) -> "LossSettings":
        """A ``GRPOConfig``'s settings, epsilons as ``GRPOTrainer.__init__`` sets them (grpo_trainer.py:937-938).

        Raises :class:`UnmodelledOption`, naming the option, for a config whose loss this module does not compute
        (:data:`UNMODELLED`)."""
        for name, default, what, lines in UNMODELLED:
            if getattr(config, name, default) != default:
                raise UnmodelledOption(
                    f"{name}={getattr(config, name)!r}: TRL's loss then {what} (grpo_trainer.py:{lines}), which "
                    f"helpers.grpo_loss does not model. Set {name}={default!r} to compare with it, or add it "
                    "to the hand loss first.")
        named = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        named.update(epsilon_low=config.epsilon,
                     epsilon_high=config.epsilon if config.epsilon_high is None else config.epsilon_high,
                     vllm_is_correction=bool(config.use_vllm and config.vllm_importance_sampling_correction),
                     grad_accum=config.gradient_accumulation_steps if grad_accum is None else grad_accum)
        return cls(**named)


def completion_logps(model: Any, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """log pi of each completion token, ``(B, C)``, at sampling temperature (trl/trainer/grpo_trainer.py:1523-1545)."""
    width = batch["completion_ids"].size(1)
    logits = model(input_ids=torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                   attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
                   logits_to_keep=width + 1, use_cache=False).logits[:, :-1, :] / temperature
    picked = logits.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    return picked - logits.logsumexp(dim=-1)


def importance_ratio(logps: torch.Tensor, old_logps: torch.Tensor | None, mask: torch.Tensor,
                     level: str = "token") -> torch.Tensor:
    """pi_theta / pi_old, per token ``(B, C)`` or per sequence ``(B, 1)`` (trl/trainer/grpo_trainer.py:3158-3188)."""
    log_ratio = logps - (logps.detach() if old_logps is None else old_logps)
    if level == "sequence":
        return torch.exp((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0))
    return torch.exp(log_ratio)


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float,
                      delta: float | None = None) -> torch.Tensor:
    """PPO's token loss; ``delta`` also caps the unclipped ratio (trl/trainer/grpo_trainer.py:3205-3213)."""
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    return -torch.min(ratio * advantages, clipped * advantages)


def k3_kl(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimate of KL(pi_theta || pi_ref) per token (trl/trainer/grpo_trainer.py:3190-3195)."""
    d = ref_logps - logps
    return torch.exp(d) - d - 1


def vespo_weight(log_ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, s: LossSettings,
                 is_ratio: torch.Tensor | None = None) -> torch.Tensor:
    """VESPO's gamma weight of the sequence ratio, ``(B, 1)``, no gradient (trl/trainer/grpo_trainer.py:3063-3111)."""
    with torch.no_grad():
        log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)  # a sum of log-ratios, not a mean
        if is_ratio is not None:  # vLLM's correction enters the weight itself
            log_w = log_w + torch.clamp(torch.log(is_ratio), math.log(1e-8), 20.0).sum(-1, keepdim=True)
        log_w = torch.clamp(log_w, math.log(1e-8), 20.0)
        k = torch.where(advantages >= 0, s.vespo_k_pos, s.vespo_k_neg)
        lam = torch.where(advantages >= 0, s.vespo_lambda_pos, s.vespo_lambda_neg).clamp(min=1e-4)
        return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def policy_term(ratio: torch.Tensor, advantages: torch.Tensor, logps: torch.Tensor, log_ratio: torch.Tensor,
                mask: torch.Tensor, s: LossSettings, is_ratio: torch.Tensor | None = None) -> torch.Tensor:
    """The per-token policy loss of ``s.loss_type`` (trl/trainer/grpo_trainer.py:3202-3231)."""
    if s.loss_type in CLIPPED:
        return clipped_surrogate(ratio, advantages, s.epsilon_low, s.epsilon_high, s.delta)
    if s.loss_type == "cispo":  # the ratio, capped at epsilon_high and detached, weights a REINFORCE term
        return -torch.clamp(ratio, max=s.epsilon_high).detach() * advantages * logps
    if s.loss_type == "sapo":  # a sigmoid gate instead of a hard clip
        tau = torch.where(advantages > 0, s.sapo_temperature_pos, s.sapo_temperature_neg)
        return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages
    return -vespo_weight(log_ratio, advantages, mask, s, is_ratio) * advantages * logps


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, s: LossSettings,
              num_items_in_batch: torch.Tensor | float | None = None) -> torch.Tensor:
    """The ``(B, C)`` token losses reduced per ``s.loss_type`` (trl/trainer/grpo_trainer.py:3245-3277).

    Every type but dapo, cispo and vespo is divided by ``grad_accum``: TRL scales for gradient accumulation
    itself and switches transformers' scaling off (``compute_loss_func``, grpo_trainer.py:962-967)."""
    x, t = per_token * mask, s.loss_type  # a (B, 1) sequence-level term broadcasts to every token here
    if t in ("dapo", "cispo", "vespo"):
        if num_items_in_batch is None:
            raise ValueError(f"loss_type={t!r} needs num_items_in_batch: the captured batch's own entry.")
        items = torch.as_tensor(num_items_in_batch, dtype=x.dtype).clamp(min=1.0) / s.num_processes
        return x.sum() / (items * s.grad_accum / s.steps_per_generation)
    if t in ("grpo", "sapo"):
        loss = (x.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif t == "bnpo":
        loss = x.sum() / mask.sum().clamp(min=1.0)
    elif t == "dr_grpo":
        loss = x.sum() / (x.size(0) * s.max_completion_length)
    else:  # luspo
        loss = x.sum(-1).mean()
    return loss / s.grad_accum


def grpo_loss(model: Any, batch: dict[str, Any], s: LossSettings,
              policy: Callable[..., torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """GRPOTrainer's loss on a captured batch, by hand: ``(loss, ratio, metrics TRL logs)`` (3113-3383).

    ``policy`` replaces :func:`policy_term` (same arguments): notebook 06's exercises plug their own in."""
    if "tool_mask" in batch:
        raise ValueError("this batch has a tool_mask (a multi-turn run): helpers.grpo_loss does not model it.")
    mask = batch["completion_mask"].float()
    adv = batch["advantages"].unsqueeze(1) if batch["advantages"].dim() == 1 else batch["advantages"]
    old = batch.get("old_per_token_logps")
    is_ratio = batch.get("importance_sampling_ratio")
    logps = completion_logps(model, batch, s.temperature)
    ratio = importance_ratio(logps, old, mask, s.importance_sampling_level)
    log_ratio = logps - (logps.detach() if old is None else old)
    per_token = (policy or policy_term)(ratio, adv, logps, log_ratio, mask, s, is_ratio)
    if s.vllm_is_correction and s.loss_type != "vespo":  # after the clip, before the KL term (3239-3240)
        per_token = per_token * is_ratio
    metrics = {}
    if s.beta != 0.0:
        kl = k3_kl(logps, batch["ref_per_token_logps"]) * (ratio if s.use_bias_correction_kl else 1.0)
        per_token = per_token + s.beta * kl
        metrics["kl"] = (kl.mean() if kl.size(1) == 1 else (kl * mask).sum() / mask.sum()).item()
    if s.loss_type in CLIPPED:  # TRL tests the ratio after the delta cap; the vLLM ratio never enters (3365-3376)
        r = ratio if s.delta is None else torch.clamp(ratio, max=s.delta)
        low, high = (r < 1 - s.epsilon_low) & (adv < 0), (r > 1 + s.epsilon_high) & (adv > 0)
        for name, hit in (("low", low), ("high", high), ("region", low | high)):
            hit = hit.float()
            hit = hit.mean() if hit.size(1) == 1 else (hit * mask).sum() / mask.sum()
            metrics[f"clip_ratio/{name}_mean"] = hit.item()
    return aggregate(per_token, mask, s, batch.get("num_items_in_batch")), ratio, metrics


def close(ours: float, theirs: float) -> bool:
    """Whether a value (a loss, a metric) is TRL's within ``LOSS_ATOL + VALUE_RTOL * |theirs|``.

    Example:
        >>> close(0.5000004, 0.5), close(0.51, 0.5)
        (True, False)
    """
    return abs(ours - theirs) <= LOSS_ATOL + VALUE_RTOL * abs(theirs)


def relative_gap(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    """||ours - theirs|| / ||theirs|| over every tensor together (e.g. two LoRA gradients); 0.0 when equal.

    Example:
        >>> relative_gap({"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([3.0, 4.0])})
        0.0
        >>> relative_gap({"w": torch.tensor([3.0, 4.5])}, {"w": torch.tensor([3.0, 4.0])})
        0.1
    """
    diff = math.sqrt(sum(float((ours[k] - theirs[k]).double().pow(2).sum()) for k in theirs))
    size = math.sqrt(sum(float(theirs[k].double().pow(2).sum()) for k in theirs))
    return diff / size if size > 0 else diff


@dataclass
class Captured:
    """One training micro-step: its batch, loss, trainable (LoRA) weights, ``grad_accum`` and logged metrics;
    ``rewards`` (per reward function) and ``advantages`` of its whole generation batch, in generation order."""

    step: int
    batch: dict[str, Any]
    loss: float
    weights: dict[str, torch.Tensor]
    grad_accum: int
    metrics: dict[str, float]
    rewards: dict[str, list[float]] = field(default_factory=dict)
    advantages: list[float] = field(default_factory=list)


def load_weights(model: Any, weights: dict[str, torch.Tensor]) -> None:
    """Copy saved trainable weights (:attr:`Captured.weights`) back into ``model``."""
    if unknown := model.load_state_dict(weights, strict=False).unexpected_keys:
        raise KeyError(f"{unknown[:3]} are not weights of this model: load weights captured from it.")


def lora_grads(model: Any) -> dict[str, torch.Tensor]:
    """The gradient of every trainable weight (zeros where there is none), then cleared."""
    out = {n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
           for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return out
