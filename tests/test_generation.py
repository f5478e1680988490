"""helpers.generation: the model is fed exactly TRL's prompt ids; greedy is deterministic, sampling seeded."""

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from helpers.generation import SamplingSettings, generate, prefill_once, transcript
from helpers.models import load_tokenizer
from helpers.profiles import get_profile
from helpers.prompts import build_prompt, encode
from helpers.tasks.reasoning import SYSTEM_PROMPT

QUESTIONS = ["What is 2 + 3?", "A much longer question, so that the prompts differ in length: what is 40 + 15?",
             "Name a colour."]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(get_profile("cpu-smoke"))


class RecordingModel:
    """Stands in for a causal LM: records what ``generate`` gets and appends one digit per row, then EOS."""

    def __init__(self, tok):
        self.tok, self.calls, self.training, self.device = tok, [], True, torch.device("cpu")
        self.rows, self.prefills = 0, []

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode

    def __call__(self, input_ids, attention_mask, **kwargs):  # the prefill of prefill_once: a cache to copy
        cache = SimpleNamespace(rows=len(input_ids))
        cache.batch_repeat_interleave = lambda n: self.prefills.append((cache.rows, n))
        return SimpleNamespace(past_key_values=cache)

    def generate(self, input_ids, attention_mask, **kwargs):
        self.calls.append(dict(kwargs, input_ids=input_ids, attention_mask=attention_mask, training=self.training))
        out = input_ids.repeat_interleave(kwargs["num_return_sequences"], dim=0)
        digits = [self.tok.convert_tokens_to_ids(str((self.rows + r) % 10)) for r in range(len(out))]
        self.rows += len(out)
        new = torch.tensor([[d, self.tok.eos_token_id] for d in digits])
        return torch.cat([out, new], dim=1)


def test_batch_size_counts_sequences_so_sampled_calls_take_fewer_prompts(tok):
    prompts = [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS]
    model = RecordingModel(tok)
    outs = generate(model, tok, prompts, SamplingSettings(temperature=1.0, num_return_sequences=2), batch_size=4)
    assert model.prefills == [(2, 2), (1, 2)]  # 2 prompts x 2 samples, then the third
    assert [len(call["input_ids"]) for call in model.calls] == [4, 2]
    assert [len(group) for group in outs] == [2, 2, 2]
    model = RecordingModel(tok)
    generate(model, tok, prompts, SamplingSettings(temperature=1.0, num_return_sequences=8), batch_size=4)
    assert model.prefills == [(1, 8)] * 3  # never fewer than one prompt a call


def test_the_model_gets_the_encoded_prompts_left_padded(tok):
    prompts = [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS]
    model = RecordingModel(tok)
    outs = generate(model, tok, prompts, SamplingSettings(max_new_tokens=5), batch_size=2)
    ids = encode(tok, prompts)
    assert len(model.calls) == 2  # batches of 2 and 1
    sent = [row for call in model.calls for row in call["input_ids"].tolist()]
    masks = [row for call in model.calls for row in call["attention_mask"].tolist()]
    for x, row, mask in zip(ids, sent, masks):
        pad = len(row) - len(x)
        assert row == [tok.pad_token_id] * pad + x
        assert mask == [0] * pad + [1] * len(x)
    assert ids[0][-3:] == tok("<|im_start|>assistant\n<reasoning>\n", add_special_tokens=False)["input_ids"][-3:]
    assert outs == [["0"], ["1"], ["2"]]  # only the new text, EOS removed, in prompt order


def test_several_samples_per_prompt_are_grouped_by_prompt(tok):
    model = RecordingModel(tok)
    settings = SamplingSettings(max_new_tokens=4, temperature=0.7, top_p=0.9, num_return_sequences=3, seed=5)
    outs = generate(model, tok, [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS[:2]], settings)
    assert outs == [["0", "1", "2"], ["3", "4", "5"]]
    call = model.calls[0]
    assert call["do_sample"] and call["temperature"] == 0.7 and call["top_p"] == 0.9 and call["top_k"] == 0
    assert model.prefills == [(2, 3)] and len(call["input_ids"]) == 6  # each prompt's cache copied 3 times
    assert call["num_return_sequences"] == 1 and call["max_new_tokens"] == 4
    assert call["eos_token_id"] == tok.eos_token_id and call["pad_token_id"] == tok.pad_token_id


def test_a_one_token_prompt_is_sampled_without_sharing_its_prefill(tok):
    model = RecordingModel(tok)
    one = tok("hi", add_special_tokens=False)["input_ids"]
    assert len(one) == 1
    outs = generate(model, tok, ["hi"], SamplingSettings(temperature=1.0, num_return_sequences=2))
    assert model.prefills == [] and model.calls[0]["num_return_sequences"] == 2  # nothing left to prefill
    assert model.calls[0]["input_ids"].tolist() == [one] and len(outs[0]) == 2


def test_greedy_unsets_sampling_knobs_and_the_training_mode_comes_back(tok):
    model = RecordingModel(tok)
    generate(model, tok, [build_prompt("hi")], SamplingSettings())
    call = model.calls[0]
    assert call["do_sample"] is False and call["temperature"] is None and call["top_p"] is None
    assert call["training"] is False and model.training is True


def test_text_prompts_get_no_template_and_template_kwargs_reach_encode(tok, monkeypatch):
    model = RecordingModel(tok)
    generate(model, tok, ["Question: 2 + 2 =", "hello world"], SamplingSettings(max_new_tokens=2))
    sent = model.calls[0]["input_ids"].tolist()
    expected = tok(text=["Question: 2 + 2 =", "hello world"])["input_ids"]
    assert [row[len(row) - len(x):] for row, x in zip(sent, expected)] == expected
    assert len(sent[0]) == len(expected[0])  # the longer prompt: no template around it, no padding

    seen = {}

    def spy(tokenizer, prompts, **kwargs):
        seen.update(kwargs)
        return encode(tokenizer, prompts)

    monkeypatch.setattr("helpers.generation.encode", spy)
    generate(model, tok, [build_prompt("hi")], chat_template_kwargs={"enable_thinking": False})
    assert seen == {"enable_thinking": False}


# --------------------------------------------------------------------------- vLLM backends, faked


class Params:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class LoRARequest:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.fixture()
def fake_vllm(monkeypatch):
    vllm, lora, request = (types.ModuleType(n) for n in ("vllm", "vllm.lora", "vllm.lora.request"))
    vllm.SamplingParams, request.LoRARequest = Params, LoRARequest
    for module in (vllm, lora, request):
        monkeypatch.setitem(sys.modules, module.__name__, module)


def _outputs(prompts, params):
    return [SimpleNamespace(outputs=[SimpleNamespace(text=f"p{i}s{j}") for j in range(params.kwargs["n"])])
            for i, _ in enumerate(prompts)]


class UnslothFastModel:
    """An Unsloth model loaded with fast_inference=True: its vLLM engine holds the base weights."""

    vllm_engine = object()

    def __init__(self):
        self.calls = []

    def load_lora(self, path):
        return ("lora", path)

    def fast_generate(self, prompts, sampling_params, lora_request, use_tqdm):
        self.calls.append(dict(prompts=prompts, params=sampling_params.kwargs, lora=lora_request))
        return _outputs(prompts, sampling_params)


class FakeLLM:
    def __init__(self):
        self.calls = []

    def generate(self, prompts, sampling_params, lora_request, use_tqdm):
        self.calls.append(dict(prompts=prompts, params=sampling_params.kwargs, lora=lora_request))
        return _outputs(prompts, sampling_params)


FakeLLM.__module__ = "vllm.entrypoints.llm"


def test_unsloth_fast_generate_gets_the_adapter_as_a_lora_request(tok, fake_vllm):
    model = UnslothFastModel()
    prompts = [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS[:2]]
    outs = generate(model, tok, prompts, SamplingSettings(max_new_tokens=9, num_return_sequences=2, seed=4),
                    adapter="/runs/x/adapter")
    assert outs == [["p0s0", "p0s1"], ["p1s0", "p1s1"]]
    call = model.calls[0]
    assert call["prompts"] == [{"prompt_token_ids": x} for x in encode(tok, prompts)]
    assert call["lora"] == ("lora", "/runs/x/adapter")
    assert call["params"] == dict(n=2, temperature=0.0, top_p=1.0, max_tokens=9, seed=4)
    generate(model, tok, prompts[:1], SamplingSettings())
    assert model.calls[1]["lora"] is None  # no adapter: the base model


def test_a_vllm_llm_gets_a_named_lora_request(tok, fake_vllm):
    llm = FakeLLM()
    generate(llm, tok, [build_prompt("hi")], SamplingSettings(temperature=0.8, top_p=0.5), adapter="/r/adapter")
    call = llm.calls[0]
    assert call["lora"].kwargs == dict(lora_name="adapter", lora_int_id=1, lora_path="/r/adapter")
    assert call["params"]["temperature"] == 0.8 and call["params"]["top_p"] == 0.5


# --------------------------------------------------------------------------- transcript


def test_transcript_asks_each_question_fresh_and_keeps_the_prefill(tok):
    model = RecordingModel(tok)
    msgs = transcript(model, tok, QUESTIONS[:2], SamplingSettings(max_new_tokens=3), system_prompt=SYSTEM_PROMPT)
    assert msgs == [{"role": "user", "content": QUESTIONS[0]}, {"role": "assistant", "content": "<reasoning>\n0"},
                    {"role": "user", "content": QUESTIONS[1]}, {"role": "assistant", "content": "<reasoning>\n1"}]
    sent = model.calls[0]["input_ids"].tolist()
    expected = encode(tok, [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS[:2]])
    assert [row[len(row) - len(x):] for row, x in zip(sent, expected)] == expected

    model = RecordingModel(tok)  # no system prompt unless given: the user turn alone
    transcript(model, tok, ["hi"], SamplingSettings())
    assert model.calls[0]["input_ids"].tolist() == encode(tok, [[{"role": "user", "content": "hi"}]])


def test_transcript_passes_adapter_and_template_kwargs_and_shows_the_templates_own_prefill(monkeypatch):
    from helpers.prompts import install_prefill
    from helpers.tasks.orders import JSON_PREFILL

    orders = load_tokenizer(get_profile("cpu-smoke", task="json"))
    seen = []

    def fake_generate(model, tokenizer, prompts, settings, adapter=None, chat_template_kwargs=None):
        seen.append((prompts, adapter, chat_template_kwargs))
        return [['name": "Ava"}'] for _ in prompts]

    monkeypatch.setattr("helpers.generation.generate", fake_generate)
    msgs = transcript(object(), orders, ["Ava ordered 2 mugs."], SamplingSettings(), system_prompt="Extract.",
                      adapter="/run/adapter", chat_template_kwargs={"enable_thinking": False})
    assert msgs[1] == {"role": "assistant", "content": JSON_PREFILL + 'name": "Ava"}'}  # '{"name": "Ava"}'
    assert seen == [([build_prompt("Ava ordered 2 mugs.", "Extract.")], "/run/adapter", {"enable_thinking": False})]
    install_prefill(orders, "")
    assert transcript(object(), orders, ["x"], SamplingSettings())[1]["content"] == 'name": "Ava"}'


# --------------------------------------------------------------------------- slow: the bundled model


@pytest.fixture(scope="module")
def bundled():
    from helpers.models import load_model

    model, tokenizer = load_model(get_profile("cpu-smoke"), lora=False)
    return model, tokenizer


@pytest.mark.slow
def test_greedy_continues_exactly_the_encoded_prompt(bundled):
    model, tok = bundled
    prompt = build_prompt("What is 15 + 27?", SYSTEM_PROMPT)
    ids = torch.tensor([encode(tok, [prompt])[0]])
    new = []
    with torch.no_grad():  # greedy by hand: argmax of the next token, 8 times
        for _ in range(8):
            nxt = model(input_ids=ids).logits[0, -1].argmax()
            if nxt.item() == tok.eos_token_id:
                break
            new.append(nxt.item())
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    assert generate(model, tok, [prompt], SamplingSettings(max_new_tokens=8)) == [[tok.decode(new)]]


@pytest.mark.slow
def test_greedy_is_deterministic_and_batches_match_one_by_one(bundled):
    model, tok = bundled
    prompts = [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS]
    settings = SamplingSettings(max_new_tokens=16)
    batched = generate(model, tok, prompts, settings, batch_size=3)
    assert generate(model, tok, prompts, settings, batch_size=3) == batched
    assert [generate(model, tok, [p], settings)[0] for p in prompts] == batched
    assert all(len(o) == 1 and o[0].strip() for o in batched)


@pytest.mark.slow
def test_sampling_with_a_seed_is_reproducible(bundled):
    model, tok = bundled
    prompts = [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS[:2]]
    settings = SamplingSettings(max_new_tokens=16, temperature=1.0, num_return_sequences=3, seed=7)
    first = generate(model, tok, prompts, settings)
    assert generate(model, tok, prompts, settings) == first
    assert all(len(group) == 3 for group in first)
    other = generate(model, tok, prompts, SamplingSettings(max_new_tokens=16, temperature=1.0,
                                                           num_return_sequences=3, seed=8))
    assert other != first


@pytest.mark.slow
def test_prefill_once_samples_the_tokens_generate_samples_for_prompts_of_any_length(bundled):
    model, tok = bundled
    ids = encode(tok, [build_prompt(q, SYSTEM_PROMPT) for q in QUESTIONS])
    width = max(len(x) for x in ids)  # left padding, as generate() builds it
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    knobs = dict(max_new_tokens=12, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tok.pad_token_id)
    outs = []
    plain = dict(input_ids=input_ids, attention_mask=mask)
    for inputs, n in ((plain, 4), (prefill_once(model, input_ids, mask, 4), 1)):
        torch.manual_seed(11)
        with torch.no_grad():
            outs.append(model.generate(**inputs, num_return_sequences=n, **knobs)[:, width:])
    assert outs[0].shape == (12, 12) and torch.equal(outs[0], outs[1])  # 3 prompts x 4 samples, the same tokens
    assert len({tuple(row) for row in outs[0].tolist()}) > 3  # and the samples of a prompt differ
