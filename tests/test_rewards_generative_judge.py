"""The generative judge: real judge models (tiny local ones, SmolLM2, an SGLang server)
grade responses through a prompt template; grades are parsed, scaled and counted.

The cheap judge of most tests is the tiny random Qwen2 of ``tiny_model_dir``: with tied
embeddings a random model's greedy reply repeats the last character of its prompt
(``"so 7"`` -> ``"7777"``), so with the template ``"{response}"`` and the pattern
``(\\d)`` its grade is the response's last digit, and a response that ends in a letter
gets no grade. Each test checks the reply against ``transformers``' own greedy decoding.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import time
from pathlib import Path

import gin
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import rewards
from rewards import generative_judge as gj
from rewards.context import RewardContext
from rewards.time_limit import RewardTimeout, call_with_time_limit
from rlkit.registry import REWARDS
from rlkit.rollout.trajectory import Trajectory
from rlkit.trainer.config import AlgorithmConfig, DataConfig, RolloutConfig, check_registered_names

ROOT = Path(__file__).resolve().parents[1]
ECHO = {"template": "{response}", "pattern": r"(\d)", "max_new_tokens": 4}


@pytest.fixture(scope="module", autouse=True)
def _close_judges_after_the_module():
    yield
    gj.close_judges()


def _ctx(response: str, ground_truth: str = "0", question: str = "q") -> RewardContext:
    return RewardContext(
        response=response,
        ground_truth=ground_truth,
        prompt=f"<user>{question}<assistant>",
        messages=({"role": "system", "content": "sys"}, {"role": "user", "content": question}),
    )


def _score(contexts: list[RewardContext], **options):
    """What the trainer does: one batched call through ``score_batch``."""
    return rewards.score_batch(
        "generative_judge",
        [c.response for c in contexts],
        [c.ground_truth for c in contexts],
        [options] * len(contexts),
        contexts=contexts,
        timeout_s=30.0,
    )


def _greedy_reply(model_dir, prompt: str, max_new_tokens: int, *, chat: bool = False) -> str:
    """The judge's reply by plain ``transformers`` greedy decoding, independently of rlkit."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if chat:
        messages = [{"role": "user", "content": prompt}]
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, add_special_tokens=not chat, return_tensors="pt").input_ids
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


# ---------------------------------------------------------------- template and grades
def test_the_template_fills_every_placeholder():
    template = "P={prompt} Q={question} R={response} T={ground_truth} {{literal}}"
    text = gj.render_template(template, _ctx("the answer", "42", question="6 x 7?"))
    assert text == "P=<user>6 x 7?<assistant> Q=6 x 7? R=the answer T=42 {literal}"


def test_question_falls_back_to_the_prompt_text_without_messages():
    context = RewardContext(response="r", ground_truth="g", prompt="raw prompt")
    assert gj.render_template("{question}|{response}", context) == "raw prompt|r"


def test_braces_inside_a_response_are_kept_as_they_are():
    context = _ctx("def f(): return {'a': 1}")
    assert gj.render_template("R: {response}", context) == "R: def f(): return {'a': 1}"


def test_the_default_template_asks_for_the_default_pattern():
    text = gj.render_template(gj.DEFAULT_TEMPLATE, _ctx("4", "4", question="2+2?"))
    assert "2+2?" in text and "Score: N" in text
    assert gj.parse_grade("Score: 7", gj.DEFAULT_PATTERN) == 7.0


@pytest.mark.parametrize(
    ("reply", "grade"),
    [
        ("Score: 7", 7.0),
        ("score:7", None),  # the pattern is case-sensitive
        ("Score: -2.5 points", -2.5),
        ("First thought Score: 3. On reflection, Score: 8", 8.0),  # the last verdict
        ("I cannot grade this.", None),
        ("", None),
    ],
)
def test_parse_grade_reads_the_last_match(reply, grade):
    assert gj.parse_grade(reply, gj.DEFAULT_PATTERN) == grade


def test_a_group_that_is_not_a_number_is_no_grade():
    assert gj.parse_grade("Grade: A", r"Grade:\s*(\w+)") is None
    assert gj.parse_grade("Grade: inf", r"Grade:\s*(\w+)") is None  # not finite


def test_grades_are_scaled_into_0_1_and_clipped():
    assert gj.scale_grade(7, max_score=10) == pytest.approx(0.7)
    assert gj.scale_grade(3, max_score=5, min_score=1) == pytest.approx(0.5)
    assert gj.scale_grade(15, max_score=10) == 1.0
    assert gj.scale_grade(-3, max_score=10) == 0.0


def test_a_result_keeps_the_raw_grade_and_counts_unparseable_replies():
    options = gj.JudgeOptions(default_score=0.25)
    parsed = gj.grade_result("Score: 5", options)
    assert parsed == {
        "score": 0.5,
        "judge/grade": 5.0,
        "judge/unparseable": 0.0,
        "judge/output": "Score: 5",
    }
    unparsed = gj.grade_result("no idea", options)
    assert unparsed == {"score": 0.25, "judge/unparseable": 1.0, "judge/output": "no idea"}


# ---------------------------------------------------------------- option checks
def _bad_cases(tmp_path: Path, model: str) -> list[tuple[dict, str]]:
    (tmp_path / "no_config").mkdir()
    return [
        ({"model": str(tmp_path / "missing")}, r"option 'model' .* is not a directory"),
        ({"model": str(tmp_path / "no_config")}, r"option 'model' .* has no config\.json"),
        ({}, r"option 'model' is missing"),
        ({"model": model, "template": "grade {prompt}"}, r"no \{response\} placeholder"),
        ({"model": model, "template": "{response} {answer}"}, r"unknown placeholders \['answer'\]"),
        ({"model": model, "template": "{response} {"}, r"option 'template' is malformed"),
        ({"model": model, "pattern": r"Score: (\d"}, r"option 'pattern' .* not a valid regular"),
        ({"model": model, "pattern": r"Score: \d+"}, r"option 'pattern' .* has no group"),
        ({"model": model, "max_score": 0}, r"option 'max_score' \(0\.0\) is not above min_score"),
        ({"model": model, "default_score": "low"}, r"option 'default_score' .* finite number"),
        ({"model": model, "max_new_tokens": 0}, r"option 'max_new_tokens' .* int >= 1"),
        (
            {"model": model, "temprature": 0.5},
            r"unknown option\(s\) \['temprature'\]; did you mean",
        ),
        ({"model": model, "engine": "trtllm"}, r"option 'engine' is unknown"),
        ({"model": model, "engine_options": {"seed": 1}}, r"sets \['seed'\], which the judge"),
        (
            {"engine": "sglang", "engine_options": {"urls": ["http://h:1"]}},
            r"'tokenizer' is missing",
        ),
    ]


def test_bad_options_stop_the_config_check_with_one_line_naming_the_option(
    tmp_path, tiny_model_dir
):
    for options, message in _bad_cases(tmp_path, str(tiny_model_dir)):
        data = DataConfig(reward="generative_judge", reward_options=options)
        with pytest.raises(ValueError, match=message) as caught:
            check_registered_names(AlgorithmConfig(), data, RolloutConfig())
        text = str(caught.value)
        assert text.startswith("generative_judge: ") and "\n" not in text, text


def test_good_options_pass_the_check_without_building_a_judge(tiny_model_dir):
    gj.close_judges()
    options = {"model": str(tiny_model_dir), "template": "{question} -> {response}"}
    data = DataConfig(reward="generative_judge", reward_options=options)
    check_registered_names(AlgorithmConfig(), data, RolloutConfig())
    assert not gj._backends  # the check reads options and paths, it loads nothing


def test_it_is_registered_as_a_batched_reward():
    entry = REWARDS.entry("generative_judge")
    assert entry.extra["batched"] is True
    assert rewards.is_batched(entry.fn)


def test_weighted_refuses_the_judge_as_a_term():
    terms = [{"reward": "gsm8k"}, {"reward": "generative_judge", "weight": 0.5}]
    data = DataConfig(reward="weighted", reward_options={"terms": terms})
    with pytest.raises(TypeError, match="'generative_judge' is batched"):
        check_registered_names(AlgorithmConfig(), data, RolloutConfig())


# ---------------------------------------------------------------- real judges
def test_a_tiny_judge_grades_parseable_replies_and_counts_the_rest(tiny_model_dir):
    responses = ["so 7", "x", "answer: 3", "12", "abc"]
    out = _score(
        [_ctx(r) for r in responses], model=str(tiny_model_dir), default_score=0.05, **ECHO
    )
    assert out.num_errors == 0
    for response, info in zip(responses, out.infos):  # what the model itself writes
        assert info["judge/output"] == _greedy_reply(tiny_model_dir, response, 4)
    # Grade = the response's last digit (the model echoes it), / 10; letters: no grade.
    assert out.scores == pytest.approx([0.7, 0.05, 0.3, 0.2, 0.05])
    assert [i["judge/unparseable"] for i in out.infos] == [0.0, 1.0, 0.0, 0.0, 1.0]
    assert [i.get("judge/grade") for i in out.infos] == [7.0, None, 3.0, 2.0, None]
    metrics = out.metrics()
    assert metrics["reward/judge/unparseable"] == pytest.approx(2 / 5)
    assert metrics["reward/judge/grade"] == pytest.approx(4.0)  # mean of the parsed ones


def test_a_judge_with_no_parseable_grade_in_a_batch_stops_with_an_example(tiny_model_dir):
    contexts = [_ctx("abc"), _ctx("xyz")]
    with pytest.raises(gj.JudgeError) as caught:
        _score(contexts, model=str(tiny_model_dir), **ECHO)
    message = str(caught.value)
    assert message.startswith("generative_judge (engine 'hf', model ")
    assert "none of the 2 replies" in message and "'(\\\\d)'" in message
    assert "the judge wrote 'cccc'" in message and "stop_if_none_parse=False" in message


def test_without_stopping_every_unparseable_reply_scores_the_default(tiny_model_dir):
    contexts = [_ctx("abc"), _ctx("xyz")]
    out = _score(
        contexts, model=str(tiny_model_dir), default_score=0.5, stop_if_none_parse=False, **ECHO
    )
    assert out.scores == [0.5, 0.5] and out.num_errors == 0
    assert out.metrics()["reward/judge/unparseable"] == 1.0


def test_the_default_template_on_a_random_model_is_unparseable(tiny_model_dir):
    with pytest.raises(gj.JudgeError, match="Score:"):
        _score([_ctx("4", "4", question="2+2?")], model=str(tiny_model_dir), max_new_tokens=4)


def test_the_judge_is_built_once_per_process_and_closed(tiny_model_dir):
    gj.close_judges()
    options = {"model": str(tiny_model_dir), **ECHO}
    first = _score([_ctx("1")], **options)
    judge = gj.prepare(options)
    second = _score([_ctx("2"), _ctx("3")], **options)
    assert gj.prepare(options) is judge and len(gj._backends) == 1
    assert first.scores + second.scores == pytest.approx([0.1, 0.2, 0.3])
    # Other scoring options, same model and engine: the same model, loaded once.
    rescaled = gj.prepare({**options, "max_score": 5})
    assert rescaled.backend is judge.backend and len(gj._backends) == 1
    assert _score([_ctx("2")], **options, max_score=5).scores == pytest.approx([0.4])
    gj.close_judges()
    assert not gj._backends and not gj._prepared


def test_the_trainer_logs_the_unparseable_fraction(tiny_model_dir, tmp_path):
    from rlkit.trainer.prompts import PromptSet
    from rlkit.trainer.scoring import score_rollout
    from tests.experiment_factory import small_experiment

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    options = {"model": str(tiny_model_dir), **ECHO}
    cfg = small_experiment(
        tiny_model_dir, tmp_path, data={"reward": "generative_judge", "reward_options": options}
    )
    prompts = PromptSet(
        token_ids=[[1], [1]],
        ground_truths=["5", "7"],
        data_sources=["toy", "toy"],
        messages=[[{"role": "user", "content": "q0"}], [{"role": "user", "content": "q1"}]],
        texts=["q0", "q1"],
    )
    rows = []
    for i, text in enumerate(["is 5", "is 6", "no", "is 8"]):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        rows.append(Trajectory([1], ids, [1] * len(ids), [0.0] * len(ids), [0] * len(ids), i // 2))
    scored = score_rollout(rows, prompts, tok, cfg, groups=[0, 0, 1, 1])
    assert scored.scores == pytest.approx([0.5, 0.6, 0.0, 0.8])
    assert scored.metrics["reward/judge/unparseable/mean"] == pytest.approx(0.25)
    assert scored.metrics["reward/num_errors"] == 0


def test_a_run_whose_judge_writes_no_grade_stops_before_the_first_update(
    demo_model_dir, tiny_model_dir, tmp_path
):
    from rlkit.trainer.trainer import RLTrainer
    from tests.experiment_factory import small_experiment

    options = {"model": str(tiny_model_dir), "max_new_tokens": 4}  # the default template
    cfg = small_experiment(
        demo_model_dir, tmp_path, data={"reward": "generative_judge", "reward_options": options}
    )
    trainer = RLTrainer(cfg)
    with pytest.raises(gj.JudgeError, match="none of the 16 replies of this batch"):
        trainer.run()
    assert trainer.step_count == 0 and trainer.weights.version == 0  # nothing trained


def test_the_chat_template_system_prompt_and_reply_prefix_shape_the_prompt(
    tiny_model_dir, tmp_path
):
    chat_dir = tmp_path / "chat_judge"
    shutil.copytree(tiny_model_dir, chat_dir)
    tok = AutoTokenizer.from_pretrained(chat_dir)
    tok.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    tok.save_pretrained(chat_dir)
    options = {"model": str(chat_dir), "system_prompt": "be fair", "reply_prefix": "Score: 4"}
    judge = gj.prepare(options)
    expected = "[system] be fair\n[user] so 7\n[assistant] Score: 4"
    assert judge.prompt_text("so 7") == expected
    assert tok.decode(judge.encode("so 7")) == expected
    plain = gj.prepare({**options, "use_chat_template": False})
    assert plain.prompt_text("so 7") == "so 7Score: 4"
    # The echo model repeats the prefix's last digit: the reply reads "Score: 44444".
    out = _score([_ctx("so 7")], **options, pattern=r"Score:\s*(\d)", max_new_tokens=4)
    assert out.infos[0]["judge/output"] == "Score: 44444"
    assert out.scores == pytest.approx([0.4])


def test_an_arithmetic_model_as_judge_writes_the_grade(demo_model_dir):
    # The SFT'd adder reads "a+b=" and writes a number: that number is the grade.
    options = {"model": demo_model_dir, "template": "{response}+{ground_truth}=", "max_score": 100}
    options |= {"pattern": r"^(\d+)", "max_new_tokens": 2}
    contexts = [_ctx("3", "4"), _ctx("12", "30")]
    out = _score(contexts, **options)
    for c, info in zip(contexts, out.infos):
        reply = _greedy_reply(demo_model_dir, f"{c.response}+{c.ground_truth}=", 2, chat=True)
        assert re.fullmatch(r"\d+", reply)  # parseable
        assert info["judge/output"] == reply and info["judge/grade"] == float(reply)
    assert out.scores == pytest.approx([min(i["judge/grade"] / 100, 1.0) for i in out.infos])


def test_setting_up_the_judge_does_not_count_against_the_time_limit():
    def slow_setup_then_score(setup_s: float, score_s: float) -> str:
        with gj._time_limit_paused():
            time.sleep(setup_s)
        time.sleep(score_s)
        return "done"

    assert call_with_time_limit(slow_setup_then_score, 0.3, 0.6, 0.0) == "done"
    with pytest.raises(RewardTimeout):  # the limit still holds for the scoring itself
        call_with_time_limit(slow_setup_then_score, 0.3, 0.1, 0.6)


def test_a_judge_that_cannot_be_built_stops_naming_it(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    with pytest.raises(
        gj.JudgeError, match=r"model '.*broken'\) could not be built: SafetensorError"
    ):
        _score([_ctx("1")], model=str(broken), **ECHO)


# ---------------------------------------------------------------- docs
DOC = (ROOT / "docs" / "generative_judge.md").read_text()


def test_the_docs_gin_example_passes_the_config_check(tiny_model_dir, tmp_path, monkeypatch):
    from rlkit.train import parse_config

    block = next(
        b
        for b in re.findall(r"```gin\n(.*?)```", DOC, flags=re.S)
        if b.startswith('DataConfig.reward = "generative_judge"')
    )
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "judge")
    (tmp_path / "experiment.gin").write_text(block)
    gin.clear_config()
    try:
        parse_config([str(tmp_path / "experiment.gin")], [])
        data = DataConfig()
        check_registered_names(AlgorithmConfig(), data, RolloutConfig())
    finally:
        gin.clear_config()
    assert data.reward == "generative_judge" and data.reward_options["model"] == "models/judge"


def test_the_docs_list_every_option():
    for name in gj.JudgeOptions.__dataclass_fields__:
        assert f"`{name}`" in DOC, name


# ---------------------------------------------------------------- slow: real models, servers
@pytest.mark.slow
def test_smollm2_as_judge_writes_parseable_grades(smollm2_dir):
    questions = [("What is 2 + 3?", "5", "5"), ("What is the capital of France?", "Paris", "Rome")]
    contexts = [_ctx(r, g, question=q) for q, g, r in questions]
    # A 135M model does not reliably follow "Reply with one line: Score: N" by itself;
    # starting its reply with "Score:" leaves it only the number to write.
    out = _score(contexts, model=smollm2_dir, reply_prefix="Score:", max_new_tokens=4)
    assert out.num_errors == 0
    assert [i["judge/unparseable"] for i in out.infos] == [0.0, 0.0], out.infos
    for info, score in zip(out.infos, out.scores):
        assert info["judge/output"].startswith("Score:")
        assert score == gj.scale_grade(info["judge/grade"], max_score=10)


#: A small CPU SGLang server (as tests/sglang/conftest.py starts them).
CPU_SERVER = {
    "device": "cpu",
    "dtype": "float32",
    "max_total_tokens": 8192,
    "attention_backend": "torch_native",
    "startup_timeout_s": 300.0,
    "request_timeout_s": 60.0,
}


@pytest.mark.slow
@pytest.mark.sglang
def test_a_judge_on_a_real_sglang_server_grades_as_the_embedded_one(tiny_model_dir, tmp_path):
    if importlib.util.find_spec("sglang") is None:
        pytest.fail("SGLang is not installed: run scripts/install_sglang.sh")
    contexts = [_ctx(r) for r in ["so 7", "x", "answer: 3"]]
    embedded = _score(contexts, model=str(tiny_model_dir), **ECHO)
    started = {"num_servers": 1, "log_dir": str(tmp_path), **CPU_SERVER}
    options = {"model": str(tiny_model_dir), "engine": "sglang", "engine_options": started, **ECHO}
    try:
        served = _score(contexts, **options)
        assert served.num_errors == 0
        assert served.scores == embedded.scores == pytest.approx([0.7, 0.0, 0.3])
        assert [i["judge/output"] for i in served.infos] == [
            i["judge/output"] for i in embedded.infos
        ]
        # Attached by URL to the running server: the tokenizer comes from the directory.
        url = gj.prepare(options).backend.engine.sync_endpoints[0].url
        attached = {"engine": "sglang", "tokenizer": str(tiny_model_dir), **ECHO}
        attached["engine_options"] = {"urls": [url], "request_timeout_s": 60.0}
        by_url = _score(contexts, **attached)
        assert by_url.scores == served.scores and by_url.num_errors == 0
    finally:
        gj.close_judges()


def test_the_docs_judge_plus_format_example_combines_the_judge_with_a_rule(
    tiny_model_dir, tmp_path, monkeypatch
):
    source = next(
        b for b in re.findall(r"```python\n(.*?)```", DOC, flags=re.S) if b.startswith("# judge")
    )
    monkeypatch.chdir(tmp_path)
    (tmp_path / "judge_plus_format.py").write_text(source)
    contexts = [_ctx("<think>a</think><answer>5</answer>", "5"), _ctx("so 3", "3")]
    options = {"model": str(tiny_model_dir), **ECHO, "template": "{response} {ground_truth}"}
    out = rewards.score_batch(
        "judge_plus_format.py:judge_plus_format",
        [c.response for c in contexts],
        [c.ground_truth for c in contexts],
        [options] * 2,
        contexts=contexts,
        timeout_s=30.0,
    )
    assert out.num_errors == 0
    # The echo judge's grade is the reference's digit. 0.8 x grade / 10 + 0.2 x format (1 for the think/answer row only).
    assert out.scores == pytest.approx([0.8 * 0.5 + 0.2, 0.8 * 0.3])
    assert [i["format"] for i in out.infos] == [1.0, 0.0]
    assert [i["judge/unparseable"] for i in out.infos] == [0.0, 0.0]
