"""Notebook 03's run in plain TRL + PEFT, no `helpers`: a script to copy into a project of your own.

    python examples/grpo_plain_trl.py                       # cpu-demo's sizes: 30 steps, ~5 min on 2 CPU cores
    python examples/grpo_plain_trl.py --sizes cpu-smoke     # 2 steps, a check that it runs
    python examples/grpo_plain_trl.py --model PATH_OR_HUB_ID --out runs/plain

The course's recipe (helpers/profiles.py): SmolLM2-135M-Instruct (by default the one `make setup` built, the Q4_1
GGUF dequantised), LoRA on every projection, an SFT warm-up on single-digit sums that teaches the format, then GRPO
on two-number sums with the arithmetic task's rewards written out. The GPU profile's lines are beside it, commented.
"""
import argparse, os, random, re
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from platformdirs import user_cache_dir
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

SIZES = {  # sums of two numbers from low to high, training rows, completion tokens, group, completions a step, ...
    "cpu-smoke": dict(low=1, high=20, rows=64, tokens=28, group=2, batch=2, steps=2, warmup=8),
    "cpu-demo": dict(low=10, high=60, rows=1000, tokens=32, group=8, batch=16, steps=30, warmup=16),
}
SYSTEM = "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
PREFILL = "<reasoning>\n"  # the chat template writes it after the prompt; the model goes on from there
TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def sums(n, low, high, seed):  # n distinct sums: the prompt, the answer, a worked solution for the warm-up
    rng, rows = random.Random(seed), {}
    while len(rows) < n:
        a, b = rng.randint(low, high), rng.randint(low, high)
        rows[f"What is {a} + {b}?"] = dict(answer=str(a + b), solution=f"{a} + {b} = {a + b}")
    return [dict(question=q, prompt=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], **r)
            for q, r in rows.items()]


# --- the rewards, as TRL calls them: completions (here conversations) and each dataset column as a keyword
def text(completion):
    return completion[0]["content"] if isinstance(completion, list) else completion

def answer_of(t):  # the last complete <answer> block, or None
    end = t.rfind("</answer>")
    start = t.rfind("<answer>", 0, end) if end >= 0 else -1
    return t[start + len("<answer>"):end].strip() if start >= 0 else None

def same(pred, gold):
    try:
        return pred is not None and float(pred) == float(gold)
    except ValueError:
        return False

def correctness(completions, answer, log_extra=None, **kwargs):  # 2.0 for the right answer in its block
    preds = [answer_of(text(c)) for c in completions]
    if log_extra:  # extra columns in TRL's completion log (log_completions=True)
        log_extra("answer", list(answer))
        log_extra("extracted", [p or "" for p in preds])
    return [2.0 if same(p, a) else 0.0 for p, a in zip(preds, answer)]

def partial_correctness(completions, answer, **kwargs):  # 1 in the block, 0.5 among its numbers, 0.25 last anywhere
    out = []
    for c, gold in zip(completions, answer):
        block, last = answer_of(text(c)), re.findall(r"\d+", text(c))[-1:]
        out.append(1.0 if same(block, gold) else 0.5 if block and gold in re.findall(r"\d+", block)
                   else 0.25 if last == [gold] else 0.0)
    return out

def formatted(t):  # one reasoning block, then one answer block, tags on their own lines, neither empty
    m = re.fullmatch(r"<reasoning>[ \t]*\n(.*?)\n[ \t]*</reasoning>\s*<answer>[ \t]*\n(.*?)\n[ \t]*</answer>",
                     t.strip(), re.DOTALL)
    return bool(m and m[1].strip() and m[2].strip()) and all(t.count(tag) == 1 for tag in TAGS)

def strict_format(completions, **kwargs):  # on the prefill + completion: the model never wrote the prefill
    return [1.0 if formatted(PREFILL + text(c)) else 0.0 for c in completions]

def xmlcount(completions, **kwargs):  # +0.25 a tag used once, -0.125 repeated; text after </answer> costs a little
    out = []
    for c in completions:
        t = PREFILL + text(c)
        score = sum(0.25 if t.count(tag) == 1 else -0.125 if t.count(tag) > 1 else 0.0 for tag in TAGS)
        tail = t[t.rfind("</answer>") + len("</answer>"):].strip() if "</answer>" in t else ""
        out.append(max(-1.0, min(1.0, score - min(0.5, 0.001 * len(tail)))))
    return out

REWARDS = [(correctness, 1.0), (partial_correctness, 0.5), (strict_format, 0.5), (xmlcount, 0.25)]


def main():
    cache = Path(os.environ.get("COURSE_CACHE") or user_cache_dir("grpo-course"))  # where `make setup` built it
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(cache / "models" / "SmolLM2-135M-Instruct"))
    ap.add_argument("--sizes", choices=SIZES, default="cpu-demo")
    ap.add_argument("--steps", type=int, help="GRPO steps (default: the sizes')")
    ap.add_argument("--out", default="runs/plain-trl")
    args = ap.parse_args()
    S, out, seed = SIZES[args.sizes], Path(args.out), 3407
    train = Dataset.from_list(sums(S["rows"], S["low"], S["high"], seed))

    torch.manual_seed(seed)  # LoRA's starting weights
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS,
                                             task_type="CAUSAL_LM"))
    # --- on a GPU (the course's colab-t4): Unsloth in 4-bit for the three lines above (`import unsloth` goes first):
    # from unsloth import FastLanguageModel
    # model, tokenizer = FastLanguageModel.from_pretrained(model_name="unsloth/Qwen2.5-1.5B-Instruct",
    #     max_seq_length=1024, load_in_4bit=True, fast_inference=False, max_lora_rank=16)
    # model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16, lora_dropout=0.0, target_modules=TARGETS,
    #     use_gradient_checkpointing="unsloth", random_state=3407)
    tokenizer.eos_token = tokenizer.pad_token = "<|im_end|>"  # stop at the end of the turn (a ChatML template)
    tokenizer.padding_side = "left"
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = cfg.pad_token_id = tokenizer.eos_token_id
    tokenizer.chat_template += '{% if add_generation_prompt %}{{ "<reasoning>\\n" }}{% endif %}'  # the prefill
    model.print_trainable_parameters()

    warm = [dict(prompt=r["prompt"], completion=[{"role": "assistant", "content": f"<reasoning>\n{r['solution']}\n"
                                                   f"</reasoning>\n<answer>\n{r['answer']}\n</answer>"}])
            for r in sums(S["warmup"], 0, 9, seed + 1)]  # single-digit sums: the format, not the task
    SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(warm), args=SFTConfig(
        output_dir=str(out / "warmup"), num_train_epochs=1, learning_rate=1e-3, lr_scheduler_type="constant",
        per_device_train_batch_size=8, completion_only_loss=True, save_strategy="no", report_to="none",
        gradient_checkpointing=False, disable_tqdm=True, seed=seed, use_cpu=not torch.cuda.is_available())).train()

    config = GRPOConfig(  # colab-t4: learning_rate=5e-6, max_completion_length=256, num_generations=6,
        # per_device_train_batch_size=6, max_steps=250, optim="adamw_8bit", weight_decay=0.1, max_grad_norm=0.1,
        # mask_truncated_completions=True, gradient_checkpointing=True, fp16=True; GSM8K's rows, no warm-up, and
        # the GSM8K rewards of helpers/tasks/arithmetic.py (PRESETS["gsm8k"])
        output_dir=str(out / "grpo"), num_generations=S["group"], per_device_train_batch_size=S["batch"],
        max_completion_length=S["tokens"], temperature=1.0, learning_rate=1e-4, lr_scheduler_type="constant",
        optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0, beta=0.0, loss_type="dapo", scale_rewards="group",
        epsilon_high=0.28, reward_weights=[w for _, w in REWARDS], max_steps=args.steps or S["steps"],
        logging_steps=1, save_steps=10, log_completions=True, num_completions_to_print=0, report_to="none",
        gradient_checkpointing=False, disable_tqdm=True, seed=seed, use_cpu=not torch.cuda.is_available())
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[f for f, _ in REWARDS], args=config,
                          train_dataset=train)
    trainer.train()
    for log in trainer.state.log_history:
        if "reward" in log:
            print(f"step {log['step']}: reward {log['reward']:.3f}, correct {log['rewards/correctness/mean']:.2f}")
    trainer.save_model(str(out / "adapter"))
    print(f"adapter saved to {out / 'adapter'} (notebook 04 scores held-out sums with it)")


if __name__ == "__main__":
    main()
