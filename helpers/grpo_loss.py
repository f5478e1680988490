"""Notebook 06's save point: TRL 1.13's GRPO loss in plain torch (trl/trainer/grpo_trainer.py:3113-3384)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch

#: Every ``loss_type`` TRL 1.13 accepts (trl/trainer/grpo_trainer.py:3202-3231, 3246-3277).
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
#: The loss types built on PPO's clipped surrogate (trl/trainer/grpo_trainer.py:3205).
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


@dataclass(frozen=True)
class LossSettings:
    """The ``GRPOConfig`` values the loss reads, and the trainer's ``current_gradient_accumulation_steps``."""

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
    grad_accum: int = 1
    steps_per_generation: int = 1

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type={self.loss_type!r}: TRL 1.13 knows {', '.join(LOSS_TYPES)}.")
        if self.importance_sampling_level not in ("token", "sequence"):
            raise ValueError(f"importance_sampling_level={self.importance_sampling_level!r}: "
                             "use 'token' or 'sequence'.")

    @classmethod
    def from_config(cls, config: Any, grad_accum: int | None = None) -> "LossSettings":
        """A ``GRPOConfig``'s settings, epsilons as ``GRPOTrainer.__init__`` sets them (grpo_trainer.py:937-938)."""
        named = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        named.update(epsilon_low=config.epsilon,
                     epsilon_high=config.epsilon if config.epsilon_high is None else config.epsilon_high,
                     grad_accum=config.gradient_accumulation_steps if grad_accum is None else grad_accum)
        return cls(**named)


def completion_logps(model: Any, batch: dict[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """log pi of each completion token, ``(B, C)``, at sampling temperature (trl/trainer/grpo_trainer.py:1538-1545)."""
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


def policy_term(ratio: torch.Tensor, advantages: torch.Tensor, logps: torch.Tensor, log_ratio: torch.Tensor,
                mask: torch.Tensor, s: LossSettings) -> torch.Tensor:
    """The per-token policy loss of ``s.loss_type`` (trl/trainer/grpo_trainer.py:3202-3231)."""
    if s.loss_type in CLIPPED:
        return clipped_surrogate(ratio, advantages, s.epsilon_low, s.epsilon_high, s.delta)
    if s.loss_type == "cispo":  # the ratio, capped at epsilon_high and detached, weights a REINFORCE term
        return -torch.clamp(ratio, max=s.epsilon_high).detach() * advantages * logps
    if s.loss_type == "sapo":  # a sigmoid gate instead of a hard clip
        tau = torch.where(advantages > 0, s.sapo_temperature_pos, s.sapo_temperature_neg)
        return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * advantages
    with torch.no_grad():  # vespo: a gamma weight of the sequence ratio (sum of log-ratios), 3063-3111
        log_w = torch.clamp((torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True), math.log(1e-8), 20.0)
        k = torch.where(advantages >= 0, s.vespo_k_pos, s.vespo_k_neg)
        lam = torch.where(advantages >= 0, s.vespo_lambda_pos, s.vespo_lambda_neg).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    return -phi * advantages * logps


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, s: LossSettings,
              num_items_in_batch: torch.Tensor | float | None = None) -> torch.Tensor:
    """The ``(B, C)`` token losses reduced per ``s.loss_type`` (trl/trainer/grpo_trainer.py:3246-3277, 1145-1148)."""
    x, t = per_token * mask, s.loss_type  # a (B, 1) sequence-level term broadcasts to every token here
    if t in ("dapo", "cispo", "vespo"):
        if num_items_in_batch is None:
            raise ValueError(f"loss_type={t!r} needs num_items_in_batch: the captured batch's own entry.")
        items = torch.as_tensor(num_items_in_batch, dtype=x.dtype).clamp(min=1.0)
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


def grpo_loss(model: Any, batch: dict[str, Any], s: LossSettings) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """GRPOTrainer's loss on a captured batch, by hand: ``(loss, ratio, metrics TRL logs)`` (3360-3376)."""
    mask = batch["completion_mask"].float()
    adv = batch["advantages"].unsqueeze(1) if batch["advantages"].dim() == 1 else batch["advantages"]
    old = batch.get("old_per_token_logps")
    logps = completion_logps(model, batch, s.temperature)
    ratio = importance_ratio(logps, old, mask, s.importance_sampling_level)
    per_token = policy_term(ratio, adv, logps, logps - (logps.detach() if old is None else old), mask, s)
    metrics = {}
    if s.beta != 0.0:
        kl = k3_kl(logps, batch["ref_per_token_logps"]) * (ratio if s.use_bias_correction_kl else 1.0)
        per_token = per_token + s.beta * kl
        metrics["kl"] = (kl.mean() if kl.size(1) == 1 else (kl * mask).sum() / mask.sum()).item()
    if s.loss_type in CLIPPED:  # TRL tests the ratio after the delta cap
        r = ratio if s.delta is None else torch.clamp(ratio, max=s.delta)
        low, high = (r < 1 - s.epsilon_low) & (adv < 0), (r > 1 + s.epsilon_high) & (adv > 0)
        for name, hit in (("low", low), ("high", high), ("region", low | high)):
            hit = hit.float()
            hit = hit.mean() if hit.size(1) == 1 else (hit * mask).sum() / mask.sum()
            metrics[f"clip_ratio/{name}_mean"] = hit.item()
    return aggregate(per_token, mask, s, batch.get("num_items_in_batch")), ratio, metrics


@dataclass
class Captured:
    """One training micro-step: its batch, loss, trainable (LoRA) weights, ``grad_accum`` and logged metrics."""

    step: int
    batch: dict[str, Any]
    loss: float
    weights: dict[str, torch.Tensor]
    grad_accum: int
    metrics: dict[str, float]


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

