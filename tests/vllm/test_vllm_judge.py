"""``generative_judge`` on the REAL vLLM server of this package, attached by URL.

The judge reaches the vLLM engine by name, as the trainer does; greedy decoding makes the
served judge's replies (and so its grades) the embedded judge's on the same model.
"""

from __future__ import annotations

import pytest

from rewards import generative_judge as gj
from tests.test_rewards_generative_judge import _ctx, _score

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

#: Grade = the first digit of the reply; a reply without one scores 0 and is counted.
OPTIONS = {"template": "{response}", "pattern": r"(\d)", "max_new_tokens": 6}


def test_a_judge_attached_to_a_vllm_server_writes_the_embedded_judges_replies(engine, model_dirs):
    contexts = [_ctx(r) for r in ["so 7", "x", "answer: 3", "12 and 9"]]
    common = {**OPTIONS, "stop_if_none_parse": False}
    try:
        embedded = _score(contexts, model=str(model_dirs["a"]), **common)
        url = engine.pool.endpoints[0].url
        served = _score(
            contexts,
            engine="vllm",
            tokenizer=str(model_dirs["a"]),
            engine_options={"urls": [url], "request_timeout_s": 60.0},
            **common,
        )
    finally:
        gj.close_judges()
    assert embedded.num_errors == served.num_errors == 0
    replies = [i["judge/output"] for i in served.infos]
    assert replies == [i["judge/output"] for i in embedded.infos]
    assert all(replies), replies  # each judge wrote something: the comparison is not vacuous
    assert served.scores == embedded.scores
