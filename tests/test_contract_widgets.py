"""Contract: the course's widgets work with the ipywidgets Colab's frontend renders (7.7.1 in its image).

Colab's frontend renders ipywidgets 7.x; with 8.x some standard widgets break there (googlecolab/colabtools
#3020, #4525), so the course requires ``ipywidgets>=7.7.1,<9`` and the install cell keeps the image's
7.7.1. The contract environment holds ipywidgets 7.7.1 (``pyproject.toml``'s contract list): every widget
is built and driven there, as a learner's typing or clicking would, and must update its view.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from .contract import contract_python

pytestmark = pytest.mark.contract
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import json, re, ipywidgets
    import pandas as pd
    from helpers.explorer import render_step
    from helpers.tasks import get_task
    from helpers.tasks.arithmetic import PRESETS
    from helpers.widgets import chat_box, completions_explorer, reward_playground

    out = {"ipywidgets": ipywidgets.__version__}
    box = reward_playground(PRESETS["arithmetic"], text="x", answer="35")
    gold, text, view = box.children
    before = view.value
    text.value = "18 + 17 = 35\\n</reasoning>\\n<answer>\\n35\\n</answer>"
    out["playground_updates"] = view.value != before and "3.250" in view.value
    gold.value = "36"
    out["playground_follows_the_answer"] = re.search(r"total\\s+0\\.750", view.value) is not None  # format alone

    orders = get_task("json")
    row = orders.make_rows("orders", 1, 0)[0]
    box = reward_playground(orders.rewards, text="x", answer=row["answer"], schema=row["schema"])
    gold, text, view = box.children
    text.value = row["answer"][len(orders.prefill):]  # what the model writes after the template's prefill
    out["json_playground_gets_the_schema"] = (re.search(r"prefilled_schema_valid_reward\\s+1\\.000", view.value)
                                              is not None and re.search(r"total\\s+4\\.000", view.value) is not None)

    df = pd.DataFrame({"step": [1, 1, 2, 2], "prompt": ["p"] * 4, "completion": ["a", "b", "c", "d"],
                       "correctness_reward": [0.0, 2.0, 2.0, 2.0], "advantage": [-0.7, 0.7, 0.0, 0.0],
                       "reward": [0.0, 2.0, 2.0, 2.0]})
    slider, html = completions_explorer(df).children
    slider.value = 1
    out["explorer_follows_the_slider"] = html.value == render_step(df, 1) and "Step 1" in html.value

    class Model:  # enough of a model for helpers.generation's path to be replaced below
        pass
    import helpers.generation as g
    asked = []
    def fake_generate(model, tok, prompts, settings, **kw):
        asked.extend(prompts)
        return [["2 + 2 = 4"] for _ in prompts]
    g.generate = fake_generate
    row, transcript_view = chat_box(Model(), None, None, system_prompt="Be brief.").children
    question, send = row.children
    question.value = "What is 2 + 2?"
    send.click()
    out["chat_answers"] = "2 + 2 = 4" in transcript_view.value and question.value == ""
    # no chat template here, so no system role: the system prompt is folded into the user turn
    out["chat_sends_the_system_prompt"] = asked == [[{"role": "user", "content": "Be brief.\\n\\nWhat is 2 + 2?"}]]
    print("WIDGETS-JSON " + json.dumps(out))
''')


def test_every_widget_works_with_colabs_ipywidgets(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.run([contract_python(), "-c", SCRIPT], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("WIDGETS-JSON ")), None)
    assert line is not None, proc.stderr[-3000:]
    out = json.loads(line[len("WIDGETS-JSON "):])
    assert out.pop("ipywidgets") == "7.7.1", "the contract environment should hold Colab's ipywidgets"
    assert all(out.values()), out
