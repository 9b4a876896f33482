"""Built-in chat templates (``ModelConfig.chat_template``): SmolLM2's with tools."""

from __future__ import annotations

import json

import pytest

from rlkit.data import CHAT_TEMPLATES, render_prompt, resolve_chat_template
from rlkit.data.chat_templates import SMOLLM2_TOOLS_TEMPLATE
from rlkit.rollout.observations import ObservationRenderer
from rlkit.tools import parse_tool_calls, schemas

# SmolLM2-135M-Instruct's own template (its tokenizer's chat_template.jinja), which
# ignores tools=; tests/test_train_smollm2_calculator.py compares with the real file.
SMOLLM2_OWN = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
]


@pytest.fixture(scope="module")
def tokenizer():
    from rlkit.models.tiny import train_byte_tokenizer

    tok = train_byte_tokenizer()
    tok.chat_template = SMOLLM2_TOOLS_TEMPLATE
    return tok


def _render(tok, template, messages, **options):
    tok.chat_template = template
    try:
        return tok.apply_chat_template(messages, tokenize=False, **options)
    finally:
        tok.chat_template = SMOLLM2_TOOLS_TEMPLATE


@pytest.mark.parametrize("generation_prompt", [False, True])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_without_tools_it_is_smollm2s_own_template(tokenizer, messages, generation_prompt):
    options = {"add_generation_prompt": generation_prompt}
    ours = _render(tokenizer, SMOLLM2_TOOLS_TEMPLATE, messages, **options)
    assert ours == _render(tokenizer, SMOLLM2_OWN, messages, **options)


def test_tools_are_rendered_in_the_system_turn_with_the_hermes_call_format(tokenizer):
    tools = schemas(["calculator"])
    text = render_prompt([{"role": "user", "content": "What is 6*7?"}], tokenizer, tools=tools)
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    )
    listed = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in listed.splitlines()] == tools
    assert (
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        in (system)
    )
    assert rest == "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
    # A system message of the prompt replaces the default one, once, before the tools.
    own = render_prompt(
        [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "1+1"}],
        tokenizer,
        tools=tools,
    )
    assert own.startswith("<|im_start|>system\nBe exact.\n\n# Tools\n")
    assert own.count("Be exact.") == 1 and "SmolLM" not in own


def test_tool_calls_and_results_render_as_hermes_blocks(tokenizer):
    call = {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "6*7"}},
    }
    conversation = [
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "42"},
        {"role": "tool", "content": "43"},
        {"role": "assistant", "content": "42"},
    ]
    text = tokenizer.apply_chat_template(
        conversation, tools=schemas(["calculator"]), tokenize=False
    )
    turns = text.split("<|im_start|>")[2:]  # after the system turn
    assert turns[1].startswith("assistant\n<tool_call>")
    calls, errors = parse_tool_calls(turns[1])
    assert errors == [] and [(c.name, c.arguments) for c in calls] == [
        ("calculator", {"expression": "6*7"})
    ]
    assert turns[2] == (
        "user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n</tool_response>"
        "<|im_end|>\n"
    )
    assert turns[3] == "assistant\n42<|im_end|>\n"


def test_the_agent_loop_renders_tool_results_after_a_policy_turn(tokenizer):
    renderer = ObservationRenderer(tokenizer, schemas(["calculator"]))
    assert renderer.turn_suffix == "<|im_end|>\n"
    ids = renderer.observation_ids(
        [{"role": "tool", "content": "42"}], policy_text_tail="</tool_call><|im_end|>"
    )
    assert tokenizer.decode(ids) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_resolve_chat_template_takes_a_name_or_jinja_and_refuses_the_rest():
    assert resolve_chat_template("smollm2_tools") is CHAT_TEMPLATES["smollm2_tools"]
    assert resolve_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    with pytest.raises(ValueError, match="'smollm3' is not a built-in template"):
        resolve_chat_template("smollm3")


def test_experiment_config_checks_the_chat_template_and_the_trainer_applies_it(tiny_model_dir):
    from rlkit.trainer.builders import load_tokenizer
    from rlkit.trainer.config import ExperimentConfig, ModelConfig

    bad = ExperimentConfig(model=ModelConfig(path=tiny_model_dir, chat_template="nope"))
    bad.data.train_files = "x.jsonl"
    with pytest.raises(ValueError, match="ModelConfig.chat_template 'nope'"):
        bad.validate()
    # The trainer's tokenizer builder, alone.
    model = ModelConfig(path=tiny_model_dir, chat_template="smollm2_tools")
    assert load_tokenizer(model).chat_template == SMOLLM2_TOOLS_TEMPLATE
    assert load_tokenizer(ModelConfig(path=tiny_model_dir)).chat_template != SMOLLM2_TOOLS_TEMPLATE
