"""logit_bias, allowed_token_ids and min_p through `vllm serve` and the `openai` client: an
ISD server at a fixed K answers as a plain server of the same checkpoint does, refusals
included."""

from __future__ import annotations

from collections import Counter

import openai
import pytest
import requests

from vllm_idlm.launch import Server

PROMPTS = ["def parse(text):\n    ", "import os\nimport sys\n\n\ndef main():\n", "class Node:\n"]


@pytest.fixture(scope="module")
def servers(demo_models, tmp_path_factory):
    logs = tmp_path_factory.mktemp("bias_min_p")
    model = demo_models["idlm"]
    spec = {"method": "idlm", "num_speculative_tokens": 3, "adaptive": False}
    with (
        Server(model, logs / "plain.log", extra=["--enforce-eager"]) as plain,
        Server(model, logs / "isd.log", spec, extra=["--enforce-eager"]) as isd,
    ):
        yield {
            name: openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
            for name, s in (("plain", plain), ("isd", isd))
        } | {"model": str(model), "isd_url": isd.url}


def complete(servers, name, prompt, **kwargs):
    """(text, token ids) of one greedy completion."""
    extra = {"ignore_eos": True, "return_token_ids": True, **kwargs.pop("extra_body", {})}
    out = servers[name].completions.create(
        model=servers["model"],
        prompt=prompt,
        max_tokens=32,
        temperature=kwargs.pop("temperature", 0),
        extra_body=extra,
        **kwargs,
    )
    return out.choices[0].text, list(out.choices[0].token_ids)


def drafts_verified(servers) -> float:
    text = requests.get(f"{servers['isd_url']}/metrics", timeout=10).text
    (line,) = [
        ln for ln in text.splitlines() if ln.startswith("vllm:spec_decode_num_draft_tokens_total")
    ]
    return float(line.split()[-1])


def test_greedy_logit_bias_and_allowed_tokens_give_the_plain_servers_text(servers):
    before = drafts_verified(servers)
    for prompt in PROMPTS:
        free_text, free_ids = complete(servers, "plain", prompt)
        ranked = [t for t, _ in Counter(free_ids).most_common()]
        requests_ = {
            "boost and ban": dict(logit_bias={str(ranked[1]): 4, str(ranked[0]): -100}),
            "allowed": dict(extra_body={"allowed_token_ids": ranked[1:]}),
        }
        for what, kwargs in requests_.items():
            expected = complete(servers, "plain", prompt, **dict(kwargs))
            assert expected[0] != free_text, f"{what} left {prompt!r} unchanged"
            assert complete(servers, "isd", prompt, **dict(kwargs)) == expected, what
    assert drafts_verified(servers) > before


def test_chat_with_logit_bias_gives_the_plain_servers_answer(servers):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(servers["model"])
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]

    def answer(name, **kwargs):
        out = servers[name].chat.completions.create(
            model=servers["model"], messages=messages, max_tokens=24, temperature=0, **kwargs
        )
        return out.choices[0].message.content

    free = answer("plain")
    ranked = Counter(tokenizer(free, add_special_tokens=False).input_ids).most_common()
    bias = {str(ranked[0][0]): -100, str(ranked[1][0]): 4}
    expected = answer("plain", logit_bias=bias)
    assert expected != free
    assert answer("isd", logit_bias=bias) == expected


def test_min_p_one_keeps_only_the_argmax_so_sampling_gives_the_greedy_text(servers):
    """min_p = 1 keeps the most likely token alone: at T = 1 every verified and drafted
    row must have it applied for the output to be the greedy output."""
    for prompt in PROMPTS:
        greedy = complete(servers, "isd", prompt)
        sampled = complete(servers, "isd", prompt, temperature=1.0, extra_body={"min_p": 1.0})
        assert sampled == greedy
        assert complete(servers, "plain", prompt, temperature=1.0, extra_body={"min_p": 1.0}) == (
            greedy
        )


def test_sampled_min_p_and_logit_bias_requests_are_served_and_the_ban_holds(servers):
    _, free_ids = complete(servers, "plain", PROMPTS[0])
    banned = Counter(free_ids).most_common(1)[0][0]
    for name in ("plain", "isd"):
        _, ids = complete(
            servers,
            name,
            PROMPTS[0],
            temperature=0.8,
            seed=7,
            logit_bias={str(banned): -100},
            extra_body={"min_p": 0.1},
        )
        assert len(ids) == 32 and banned not in ids


def test_an_out_of_vocab_logit_bias_gets_the_plain_servers_400(servers):
    errors = {}
    for name in ("plain", "isd"):
        with pytest.raises(openai.BadRequestError) as caught:
            complete(servers, name, PROMPTS[0], logit_bias={"10000000": 5})
        errors[name] = (caught.value.status_code, caught.value.body)
    assert errors["isd"] == errors["plain"]
    assert errors["isd"][0] == 400 and "out-of-vocab" in str(errors["isd"][1])
    assert complete(servers, "isd", PROMPTS[0])[1]  # and the server serves on
