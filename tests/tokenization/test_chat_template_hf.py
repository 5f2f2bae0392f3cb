"""Chat templates and encoding match HuggingFace transformers' own (``PreTrainedTokenizerFast``
loaded from the same folder): the ChatML fixture, a Llama-3-style template written here,
system messages, multi-turn chats, ``add_generation_prompt``, tools through ``tojson``,
``raise_exception``, and BOS from the post-processor (added to completions, not again to
chats)."""

from __future__ import annotations

import pytest

# transformers (and torch) are test dependencies (`.[test]`): the comparison must run, never skip
import transformers  # noqa: E402

from fastdeploy_mtp.tokenization import ChatTemplateError, load_tokenizer
from tests.support.tokenizer_files import write_bpe_tokenizer

#: Llama-3 style: BOS, an optional system message pulled out of the list, header tokens per
#: turn, a date from ``strftime_now``, tools rendered with ``tojson``, and trimmed contents.
LLAMA3_TEMPLATE = """\
{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + strftime_now("%d %b %Y") + "\\n\\n" }}
{%- if tools is not none %}
    {{- "You may call these functions:\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception("roles must be user or assistant after the system message, got "
            + message['role']) }}
    {%- endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {{- message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

CHATS = [
    [{"role": "user", "content": "Hello there"}],
    [
        {"role": "system", "content": "You answer in French. "},
        {"role": "user", "content": "  Où est la gare?  "},
    ],
    [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": 'and 日本語 🎉 "quotes" <b>tags</b>?'},
    ],
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city <today> & tomorrow",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "Zürich"}},
            },
        },
    }
]


def _pair(folder):
    return load_tokenizer(str(folder)), transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    return _pair(write_bpe_tokenizer(str(tmp_path_factory.mktemp("chatml"))))


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama3")
    write_bpe_tokenizer(
        str(folder),
        chat_template=LLAMA3_TEMPLATE,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        prepend_bos=True,
    )
    return _pair(folder)


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chatml_renders_as_transformers(chatml, chat, add_generation_prompt):
    ours, theirs = chatml
    want = theirs.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    got = ours.apply_chat_template(chat, add_generation_prompt=add_generation_prompt)
    assert got == want
    assert got.startswith("<|im_start|>system\n")


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_llama3_style_renders_as_transformers(llama3, chat, tools):
    ours, theirs = llama3
    want = theirs.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(chat, tools=tools) == want
    assert want.startswith("<|endoftext|><|start_header_id|>system")


def test_tools_are_json_without_html_escapes(llama3):
    ours, _ = llama3
    text = ours.apply_chat_template(CHATS[0], tools=TOOLS)
    assert '"description": "Weather in a city <today> & tomorrow"' in text
    assert '"Zürich"' in text  # not \\u00fc


@pytest.mark.parametrize("pair", ["chatml", "llama3"])
def test_raise_exception_refuses_a_role(pair, request):
    ours, theirs = request.getfixturevalue(pair)
    chat = [{"role": "system", "content": "s"}, {"role": "tool", "content": "x"}]
    with pytest.raises(Exception) as hf_error:
        theirs.apply_chat_template(chat, tokenize=False)
    with pytest.raises(ChatTemplateError) as ours_error:
        ours.apply_chat_template(chat)
    assert str(hf_error.value) in str(ours_error.value)
    assert "\n" not in str(ours_error.value)


TEXTS = [
    "The quick brown fox",
    " leading space",
    "café 日本語 🎉",
    "<|im_start|>user\nhi<|im_end|>",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(chatml, llama3, text, add_special_tokens):
    for ours, theirs in (chatml, llama3):
        want = theirs(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert ours.encode(text, add_special_tokens=add_special_tokens) == want


def test_post_processor_bos_for_completions_only(llama3):
    ours, _ = llama3
    bos = ours.backend.token_to_id("<|endoftext|>")
    assert ours.encode("hi")[0] == bos
    prompt = ours.apply_chat_template(CHATS[0])
    ids = ours.encode(prompt, add_special_tokens=False)  # how chat requests are tokenized
    assert ids.count(bos) == 1 and ids[0] == bos


def test_add_bos_token_does_not_override_tokenizer_json(tmp_path):
    """As in transformers 5: with a tokenizer.json, its post-processor decides."""
    folder = write_bpe_tokenizer(
        str(tmp_path), bos_token="<|endoftext|>", extra_config={"add_bos_token": True}
    )
    ours, theirs = _pair(folder)
    assert ours.encode("hi") == theirs("hi")["input_ids"]
    assert ours.backend.token_to_id("<|endoftext|>") not in ours.encode("hi")


@pytest.mark.parametrize("skip", [True, False])
def test_decode_matches_transformers(chatml, skip):
    ours, theirs = chatml
    ids = ours.encode("<|im_start|>assistant\nThe café 日本語<|im_end|>")
    assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
        ids, skip_special_tokens=skip
    )
    assert ours.decode(ids).startswith("assistant\n")
