"""A judge that dies mid-run costs its rewards, not the run (issue 54, item 4).

A real GRPO run on cpu-smoke with the bundled model, rewarded by the judge (llama.cpp's server with the bundled GGUF,
a real process on 127.0.0.1) and the format reward. After step 1 the server is killed (SIGKILL, its whole process
group); after step 3 a new one starts on the same port. The run must finish every step, log the judge's reward as
missing (None) exactly while it was down with the named warning, save its checkpoint and adapter, keep every step's
completions and reward log, and score with the judge again once it is back; no server process is left."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

pytestmark = pytest.mark.slow
KILL_AFTER, RESTART_AFTER, STEPS = 1, 3, 5


def test_a_judge_killed_mid_run_is_none_while_down_and_back_after_restart(tmp_path):
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from helpers.callbacks import step_logs
    from helpers.export import bundled_gguf
    from helpers.judge import FAILED, JudgeWatchCallback, judge_reward
    from helpers.models import load_model
    from helpers.profiles import get_profile
    from helpers.prompts import build_prompt
    from helpers.reward_logs import logged
    from helpers.serve import llama_server, port_is_free
    from helpers.tasks import get_task
    from helpers.tasks.reasoning import prefilled_strict_format_reward
    from helpers.training import grpo_config

    profile = get_profile("cpu-smoke")
    task = get_task(profile.task)
    rows = task.make_rows(profile.task_level, 2 * STEPS, seed=profile.seed)
    train = Dataset.from_list([dict(r, prompt=build_prompt(r["question"], task.system_prompt)) for r in rows])
    model, tokenizer = load_model(profile)
    logs, printed = tmp_path / "reward-logs", []
    servers, stack = [], contextlib.ExitStack()
    with stack:
        servers.append(stack.enter_context(llama_server(bundled_gguf(), threads=1)))
        port = servers[0].port
        judge = judge_reward(servers[0].base_url, prefill=task.prefill, timeout=10, retries=1, backoff=0.1,
                             log_dir=logs)

        class KillAndRestart(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == KILL_AFTER:
                    os.killpg(servers[0].process.pid, signal.SIGKILL)
                    servers[0].process.wait(30)
                if state.global_step == RESTART_AFTER:
                    servers.append(stack.enter_context(llama_server(bundled_gguf(), port=port, threads=1)))

        config = grpo_config(profile, tmp_path, max_steps=STEPS, save_steps=STEPS, report_to="none",
                             reward_weights=[1.0, 0.5])
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config, train_dataset=train,
                              reward_funcs=[judge, logged(prefilled_strict_format_reward, logs)],
                              callbacks=[KillAndRestart(), JudgeWatchCallback(print_fn=printed.append)])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        trainer.save_model(str(tmp_path / "adapter"))
    down = range(KILL_AFTER + 1, RESTART_AFTER + 1)

    history = step_logs(trainer.state.log_history)
    assert [h["step"] for h in history] == list(range(1, STEPS + 1)) and trainer.state.global_step == STEPS
    assert [h[FAILED] for h in history] == [1.0 if h["step"] in down else 0.0 for h in history]
    judged = {h["step"]: h["rewards/judge_reward/mean"] for h in history}
    assert all((judged[s] is None) == (s in down) for s in judged), judged  # TRL's nanmean of all-None: None
    assert all(h["rewards/prefilled_strict_format_reward/mean"] is not None for h in history)
    assert len(printed) == 1 and printed[0].startswith(f"WARNING [judge-unavailable] step {KILL_AFTER + 1}:")

    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "grpo" / f"checkpoint-{STEPS}" / "trainer_state.json").is_file()
    parquet = sorted(p.name for p in (tmp_path / "grpo" / "completions").glob("*.parquet"))
    assert parquet == [f"completions_{s:05d}.parquet" for s in range(1, STEPS + 1)]
    per_completion = profile.per_device_train_batch_size
    judge_log = [json.loads(line) for line in (logs / "judge_reward.jsonl").read_text().splitlines()]
    assert [r["step"] for r in judge_log] == [s for s in range(1, STEPS + 1) for _ in range(per_completion)]
    assert all((r["score"] is None) == (r["step"] in down) for r in judge_log)
    assert all("APIConnectionError" in r["error"] for r in judge_log if r["step"] in down)
    format_log = (logs / "prefilled_strict_format_reward.jsonl").read_text().splitlines()
    assert len(format_log) == STEPS * per_completion

    assert len(servers) == 2 and all(s.process.poll() is not None for s in servers) and port_is_free(port)
