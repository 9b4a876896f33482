"""Generative judge: a language model grades every response; the grade is read from its text.

A batched reward (one call per scoring call, :mod:`rewards.batched_reward`)::

    DataConfig.reward = "generative_judge"
    DataConfig.reward_options = {"model": "models/judge", "max_score": 10}

For each response the judge's prompt is ``template`` with the placeholders filled in
(:func:`render_template`), run through the judge tokenizer's chat template; the judge
(a rollout engine found by name in :data:`rlkit.registry.ROLLOUT_ENGINES`: the embedded
``hf`` engine on a frozen copy of ``model``, or ``sglang`` / ``vllm`` servers, started
or attached by URL) writes a reply, greedily by default, and ``pattern``'s first group in its last
match is the grade (:func:`parse_grade`), scaled into [0, 1] (:func:`scale_grade`).

Failures, from cheapest to catch to dearest:

* bad options (a model directory that does not exist, a template without ``{response}``,
  a regex without a group, ...) stop ``rlkit train`` at the config check, before any
  model loads (:func:`check_options`);
* a judge that cannot be built (its model does not load, its servers do not start), or
  a batch in which *no* grade parses, raises :class:`JudgeError`, which stops the run:
  the first batch is scored before the first update, so a judge that never writes a
  grade stops it before any training, with an example of what it wrote;
* a reply without a grade, in a batch where others parse, scores ``default_score``
  and is counted: ``judge/unparseable`` is 1 for it and 0 for a parsed one, logged as
  ``reward/judge/unparseable/mean`` (the fraction of unparseable grades);
* a generation that fails (a server that died) raises an ordinary exception, which
  :func:`rewards.score_batch` counts as an error for every row of the batch.

The judge is built once per process (per distinct model / engine options), on first
use, and closed at exit (:func:`close_judges`). See docs/generative_judge.md.
"""

from __future__ import annotations

import atexit
import difflib
import json
import math
import numbers
import os
import re
import signal
import string
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rewards.context import RewardContext
from rlkit.models.sampling_params import SamplingParams
from rlkit.registry import REWARDS, ROLLOUT_ENGINES

NAME = "generative_judge"

DEFAULT_TEMPLATE = (
    "Grade the answer to the question below against the reference answer.\n\n"
    "Question:\n{question}\n\n"
    "Reference answer:\n{ground_truth}\n\n"
    "Answer to grade:\n{response}\n\n"
    "How correct is the answer, from 0 (wrong) to 10 (fully correct)? "
    "Reply with one line: Score: N"
)
"""The built-in template: asks for ``Score: N`` on a 0-10 scale (``max_score`` 10)."""

DEFAULT_PATTERN = r"Score:\s*(-?\d+(?:\.\d+)?)"
"""The built-in grade pattern: the number after ``Score:``."""

PLACEHOLDERS = ("prompt", "question", "response", "ground_truth")
"""What a template may name: the policy's prompt as it saw it (chat template applied),
the last user message of the prompt (the question), the response, the reference answer."""

DTYPES = ("auto", "float32", "bfloat16", "float16")

#: Characters of the judge's reply kept in each row's ``judge/output`` (and in errors).
OUTPUT_CHARS = 300

# What every engine factory receives from the judge, as from the trainer.
_FACTORY_ARGUMENTS = ("model_path", "tokenizer", "weights", "seed")

# Engines whose factories take ``extra_eos_token_ids`` (an instruct judge's end-of-turn ids).
_EOS_AWARE_ENGINES = ("hf", "sglang", "vllm")
# Engines that start servers unless attached by URL; the judge's logs get their own folder.
_SERVER_ENGINES = ("sglang", "vllm")


class JudgeError(BaseException):
    """The judge cannot score at all: it could not be built, or no grade of a batch parsed.

    A ``BaseException``, as :class:`rewards.time_limit.RewardTimeout` is, so that
    :func:`rewards.score_batch` does not turn it into a zero score per row: a judge
    that never grades would otherwise train on a constant reward without a word.
    """


@dataclass(frozen=True)
class JudgeOptions:
    """``DataConfig.reward_options`` of ``generative_judge``, checked (:func:`parse_options`).

    Attributes:
        model: the judge's Hugging Face model directory (the embedded engine loads it,
            SGLang or vLLM servers are started from it); its tokenizer encodes the prompts.
        tokenizer: another directory for the tokenizer (default: ``model``); with a
            server attached by URL, one of the two is needed.
        engine: a rollout engine name: ``hf`` (embedded), ``sglang`` or ``vllm``, or your
            own.
        engine_options: keyword arguments of the engine's factory (``urls``,
            ``router_url``, ``num_servers``, ``device``, ``generation_batch_size``, ...).
        template: the judge's prompt, with ``{response}`` and optionally ``{prompt}``,
            ``{question}``, ``{ground_truth}``; literal braces are written ``{{`` ``}}``.
        pattern: a regular expression whose first group is the grade (a number).
        max_score, min_score: a grade of ``max_score`` scores 1 and one of ``min_score``
            scores 0; grades outside are clipped.
        default_score: the score of a reply without a grade (not scaled).
        max_new_tokens: the judge's reply budget in tokens.
        temperature: 0 (default) decodes greedily, so grades are reproducible.
        use_chat_template: wrap the prompt as a user message in the tokenizer's chat
            template (when it has one); else the text is the prompt as it is.
        system_prompt: a system message before it (with the chat template only).
        reply_prefix: text the judge's reply starts with, put after the prompt (after
            the chat template's assistant header), e.g. ``"Score:"``: a small judge then
            only has to write the number. The grade is read from prefix + reply.
        device, dtype: where and in what precision the embedded engine's judge runs;
            ``auto`` is this process's accelerator (or the CPU) and float32 on a CPU,
            bfloat16 elsewhere.
        stop_if_none_parse: raise :class:`JudgeError` when no grade of a batch parses.
    """

    model: str | None = None
    tokenizer: str | None = None
    engine: str = "hf"
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    template: str = DEFAULT_TEMPLATE
    pattern: str = DEFAULT_PATTERN
    max_score: float = 10.0
    min_score: float = 0.0
    default_score: float = 0.0
    max_new_tokens: int = 64
    temperature: float = 0.0
    use_chat_template: bool = True
    system_prompt: str | None = None
    reply_prefix: str = ""
    device: str = "auto"
    dtype: str = "auto"
    stop_if_none_parse: bool = True

    def engine_key(self) -> str:
        """What the built judge depends on: one judge per distinct key in a process."""
        parts = [self.model, self.tokenizer, self.engine, dict(self.engine_options)]
        return json.dumps([*parts, self.device, self.dtype], sort_keys=True, default=repr)

    def label(self) -> str:
        """The judge, in words, for messages."""
        where = self.engine_options.get("router_url") or self.engine_options.get("urls")
        target = repr(self.model or self.tokenizer) + (f" at {where}" if where else "")
        return f"{NAME} (engine {self.engine!r}, model {target})"


_OPTION_NAMES = tuple(JudgeOptions.__dataclass_fields__)


def _fail(option: str, problem: str, fix: str) -> ValueError:
    return ValueError(f"{NAME}: option {option!r} {problem}; {fix}")


# ------------------------------------------------------------------ checking options
def check_template(template: Any) -> str:
    """``template`` if it is a valid judge template, else a ``ValueError`` saying why.

    A template follows ``str.format``'s rules: placeholders are ``{name}`` for a name
    in :data:`PLACEHOLDERS` (``{response}`` is required), literal braces are doubled.
    """
    if not isinstance(template, str):
        raise _fail("template", f"is {type(template).__name__}", "give a string")
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        fix = "write literal braces as {{ and }}"
        raise _fail("template", f"is malformed ({exc})", fix) from None
    unknown = sorted({f for f in fields if f not in PLACEHOLDERS})
    if unknown:
        names = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
        raise _fail(
            "template",
            f"names unknown placeholders {unknown}",
            f"use {names} (literal braces are written {{{{ and }}}})",
        )
    if "response" not in fields:
        raise _fail(
            "template", "has no {response} placeholder", "put {response} where the answer goes"
        )
    return template


def check_pattern(pattern: Any) -> re.Pattern[str]:
    """``pattern`` compiled, if it is a regular expression with at least one group."""
    if not isinstance(pattern, str):
        raise _fail("pattern", f"is {type(pattern).__name__}", "give a regular expression string")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        problem = f"{pattern!r} is not a valid regular expression ({exc})"
        raise _fail("pattern", problem, "escape literal ( ) [ ] + * ? with a backslash") from None
    if compiled.groups < 1:
        raise _fail(
            "pattern",
            f"{pattern!r} has no group",
            "wrap the grade in parentheses, e.g. r'Score:\\s*(\\d+)'",
        )
    return compiled


def _check_dir(option: str, path: Any, *, model: bool) -> str:
    if not isinstance(path, str | os.PathLike):
        raise _fail(option, f"is {type(path).__name__}", "give a local directory path")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise _fail(option, f"{str(path)!r} is not a directory", "give a local model directory")
    if model and not (p / "config.json").is_file():
        raise _fail(option, f"{str(path)!r} has no config.json", "give a Hugging Face model dir")
    return str(p)


def _number(options: Mapping[str, Any], name: str, default: float) -> float:
    value = options.get(name, default)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise _fail(name, f"is {value!r}", "give a finite number")
    return float(value)


def _flag(options: Mapping[str, Any], name: str, default: bool) -> bool:
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise _fail(name, f"is {value!r}", "give True or False")
    return value


def _check_names(options: Mapping[str, Any]) -> None:
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        near = difflib.get_close_matches(unknown[0], _OPTION_NAMES, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ValueError(
            f"{NAME}: unknown option(s) {unknown}; {hint}options: {', '.join(_OPTION_NAMES)}"
        )


def _check_engine(options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    engine = options.get("engine", "hf")
    if not isinstance(engine, str):
        raise _fail("engine", f"is {engine!r}", "give a rollout engine name such as 'hf'")
    try:
        entry = ROLLOUT_ENGINES.entry(engine)
    except KeyError as exc:
        raise _fail("engine", f"is unknown ({exc})", "use 'hf', 'sglang' or 'vllm'") from None
    engine_options = options.get("engine_options") or {}
    if not isinstance(engine_options, Mapping):
        raise _fail("engine_options", f"is {engine_options!r}", "give a dict of factory options")
    passed = sorted(set(engine_options) & set(_FACTORY_ARGUMENTS))
    if passed:
        raise _fail(
            "engine_options",
            f"sets {passed}, which the judge passes itself",
            "give the model as the option 'model' (and 'tokenizer')",
        )
    return entry.name, dict(engine_options)


def _check_sources(options: Mapping[str, Any], engine: str, attached: bool) -> tuple[Any, Any]:
    model = options.get("model")
    tokenizer = options.get("tokenizer")
    model = None if model is None else _check_dir("model", model, model=True)
    tokenizer = None if tokenizer is None else _check_dir("tokenizer", tokenizer, model=False)
    if model is None and not attached:
        raise _fail("model", "is missing", "give the judge's local model directory")
    if model is None and tokenizer is None:
        raise _fail(
            "tokenizer",
            f"is missing (engine {engine!r} attached to a server without 'model')",
            "give the served model's directory as 'model' or 'tokenizer'",
        )
    return model, tokenizer


def _check_generation(options: Mapping[str, Any]) -> dict[str, Any]:
    max_new_tokens = options.get("max_new_tokens", 64)
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise _fail("max_new_tokens", f"is {max_new_tokens!r}", "give an int >= 1")
    temperature = _number(options, "temperature", 0.0)
    if temperature < 0:
        raise _fail("temperature", f"is {temperature}", "give 0 (greedy) or more")
    dtype = options.get("dtype", "auto")
    if dtype not in DTYPES:
        raise _fail("dtype", f"is {dtype!r}", f"use one of {', '.join(DTYPES)}")
    device = options.get("device", "auto")
    if not isinstance(device, str):
        raise _fail("device", f"is {device!r}", "give 'auto', 'cpu', 'cuda', 'cuda:1', ...")
    system_prompt = options.get("system_prompt")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise _fail("system_prompt", f"is {system_prompt!r}", "give a string or None")
    reply_prefix = options.get("reply_prefix", "")
    if not isinstance(reply_prefix, str):
        raise _fail("reply_prefix", f"is {reply_prefix!r}", "give a string ('' for none)")
    return {
        "reply_prefix": reply_prefix,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "dtype": dtype,
        "device": device,
        "system_prompt": system_prompt,
        "use_chat_template": _flag(options, "use_chat_template", True),
        "stop_if_none_parse": _flag(options, "stop_if_none_parse", True),
    }


def parse_options(options: Mapping[str, Any]) -> JudgeOptions:
    """Check ``DataConfig.reward_options`` of ``generative_judge``; return them parsed.

    Raises:
        ValueError: an unknown option, or one with a bad value; the one-line message
            names the option and the fix.
    """
    _check_names(options)
    engine, engine_options = _check_engine(options)
    attached = bool(engine_options.get("urls") or engine_options.get("router_url"))
    model, tokenizer = _check_sources(options, engine, attached)
    template = check_template(options.get("template", DEFAULT_TEMPLATE))
    pattern = check_pattern(options.get("pattern", DEFAULT_PATTERN)).pattern
    max_score = _number(options, "max_score", 10.0)
    min_score = _number(options, "min_score", 0.0)
    if max_score <= min_score:
        raise _fail("max_score", f"({max_score}) is not above min_score ({min_score})", "raise it")
    return JudgeOptions(
        model=model,
        tokenizer=tokenizer,
        engine=engine,
        engine_options=engine_options,
        template=template,
        pattern=pattern,
        max_score=max_score,
        min_score=min_score,
        default_score=_number(options, "default_score", 0.0),
        **_check_generation(options),
    )


def check_options(options: Mapping[str, Any]) -> None:
    """The config check of ``generative_judge`` (before any model loads): the options'
    values, paths and the template and pattern; the judge itself is not built here."""
    parse_options(options)


# ------------------------------------------------------------------ prompts and grades
def _question(context: RewardContext) -> str:
    users = [m for m in context.messages if m.get("role") == "user"]
    return str(users[-1].get("content", "")) if users else context.prompt


def render_template(template: str, context: RewardContext) -> str:
    """The judge's prompt text for one response: ``template`` with its placeholders filled.

    ``{question}`` is the content of the prompt's last user message (the prompt text
    when there are no messages); ``{prompt}`` the prompt as the policy saw it.
    """
    return template.format(
        prompt=context.prompt,
        question=_question(context),
        response=context.response,
        ground_truth=context.ground_truth,
    )


def parse_grade(text: str, pattern: str | re.Pattern[str]) -> float | None:
    """The grade in a judge's reply: the first group of ``pattern``'s *last* match (the
    final verdict of a judge that reasons first) as a number; ``None`` when there is no
    match or the group is not a finite number."""
    matches = list(re.finditer(pattern, text))
    if not matches or matches[-1].group(1) is None:
        return None
    try:
        grade = float(matches[-1].group(1).strip())
    except ValueError:
        return None
    return grade if math.isfinite(grade) else None


def scale_grade(grade: float, *, max_score: float, min_score: float = 0.0) -> float:
    """``grade`` mapped linearly so that ``min_score`` -> 0 and ``max_score`` -> 1, clipped."""
    return min(1.0, max(0.0, (grade - min_score) / (max_score - min_score)))


def grade_result(output: str, options: JudgeOptions) -> dict[str, Any]:
    """One row's reward result from the judge's reply ``output``."""
    grade = parse_grade(output, options.pattern)
    shown = output[:OUTPUT_CHARS]
    if grade is None:
        return {"score": options.default_score, "judge/unparseable": 1.0, "judge/output": shown}
    score = scale_grade(grade, max_score=options.max_score, min_score=options.min_score)
    return {"score": score, "judge/grade": grade, "judge/unparseable": 0.0, "judge/output": shown}


# ------------------------------------------------------------------ the judge
class FrozenModelWeights:
    """:class:`rlkit.rollout.base.PolicyWeights` of a judge: a causal LM loaded from a
    directory on first use (an engine serving the directory itself never loads it here),
    never updated."""

    def __init__(self, model_path: str, *, dtype: str = "auto", device: str = "auto") -> None:
        self.model_path = model_path
        self.dtype = dtype
        self.device = device
        self._model: Any = None

    @property
    def version(self) -> int:
        return 0

    @property
    def model(self) -> Any:
        """The judge model, in eval mode, without gradients, on its device."""
        if self._model is None:
            from rlkit.models.loading import load_causal_lm

            device = _resolve_device(self.device)
            dtype = self.dtype if self.dtype != "auto" else _auto_dtype(device)
            model = load_causal_lm(self.model_path, dtype=dtype).to(device).eval()
            self._model = model.requires_grad_(False)
        return self._model

    @contextmanager
    def generation_context(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        yield self.model, {}

    def named_tensors(self) -> Iterator[tuple[str, Any]]:
        for name, tensor in self.model.state_dict().items():
            yield name, tensor.detach().cpu()

    def save_pretrained(self, path: str) -> None:
        self.model.save_pretrained(path)


def _resolve_device(device: str) -> Any:
    import torch

    if device != "auto":
        return torch.device(device)
    import rlkit.device

    platform = rlkit.device.current()
    # Under a launcher every process judges its own rows on its own accelerator.
    index = int(os.environ.get("LOCAL_RANK", "0")) % max(platform.device_count(), 1)
    return platform.device(index)


def _auto_dtype(device: Any) -> str:
    return "float32" if device.type == "cpu" else "bfloat16"


def _generation_eos_ids(model_dir: str | None) -> list[int]:
    """EOS ids of the model's generation config (instruct models often end turns there)."""
    if model_dir is None:
        return []
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS is all there is
        return []
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)


class JudgeBackend:
    """A built judge model: its tokenizer and rollout engine, shared by every set of
    options that names the same model, engine and engine options."""

    def __init__(self, options: JudgeOptions) -> None:
        from transformers import AutoTokenizer

        self.label = options.label()
        self.tokenizer = AutoTokenizer.from_pretrained(options.tokenizer or options.model)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.engine = _build_engine(options, self.tokenizer)

    def close(self) -> None:
        """Release the engine (servers it started, the judge's memory)."""
        self.engine.close()


def _build_engine(options: JudgeOptions, tokenizer: Any) -> Any:
    """The rollout engine ``options.engine`` names, called as the trainer calls it."""
    o = options
    engine_options = dict(o.engine_options)
    if o.engine in _EOS_AWARE_ENGINES:
        eos = [*engine_options.get("extra_eos_token_ids", ()), *_generation_eos_ids(o.model)]
        engine_options["extra_eos_token_ids"] = eos
    if o.engine in _SERVER_ENGINES:
        if engine_options.get("urls") or engine_options.get("router_url"):
            engine_options.setdefault("num_servers", 0)  # attach: start nothing
        # Its own folder: the policy's engine writes runs/sglang or runs/vllm.
        engine_options.setdefault("log_dir", f"runs/{o.engine}_judge")
    weights = FrozenModelWeights(o.model, dtype=o.dtype, device=o.device) if o.model else None
    if weights is not None and o.engine == "hf":
        weights.model  # noqa: B018 - load now, so a judge that cannot load fails while built
    return ROLLOUT_ENGINES.get(o.engine)(
        model_path=o.model, tokenizer=tokenizer, weights=weights, seed=0, **engine_options
    )


class Judge:
    """A judge for one set of options: renders prompts, asks the backend, reads grades."""

    def __init__(self, options: JudgeOptions, backend: JudgeBackend) -> None:
        self.options = options
        self.backend = backend

    def prompt_text(self, text: str) -> str:
        """What the judge reads for a rendered template: the chat template around it
        (when used), then ``reply_prefix``."""
        o = self.options
        if self._chat():
            system = [{"role": "system", "content": o.system_prompt}] if o.system_prompt else []
            messages = [*system, {"role": "user", "content": text}]
            text = self.backend.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        return text + o.reply_prefix

    def encode(self, text: str) -> list[int]:
        """The judge's prompt token ids for a rendered template."""
        # A chat template writes its own special tokens; plain text gets the tokenizer's.
        encoded = self.backend.tokenizer(
            self.prompt_text(text), add_special_tokens=not self._chat()
        )
        return encoded["input_ids"]

    def _chat(self) -> bool:
        template = getattr(self.backend.tokenizer, "chat_template", None)
        return self.options.use_chat_template and bool(template)

    def replies(self, texts: Sequence[str]) -> list[str]:
        """The judge's reply to each prompt text, in order, ``reply_prefix`` first."""
        batch = self.backend.engine.generate([self.encode(t) for t in texts], self._params())
        decoded = self.backend.tokenizer.batch_decode(batch.response_ids, skip_special_tokens=True)
        return [self.options.reply_prefix + d for d in decoded]

    def grade(self, contexts: Sequence[RewardContext]) -> list[dict[str, Any]]:
        """One result per context (:func:`grade_result`), in order.

        Raises:
            JudgeError: with ``stop_if_none_parse``, no reply has a grade.
        """
        texts = [render_template(self.options.template, c) for c in contexts]
        outputs = self.replies(texts)
        results = [grade_result(o, self.options) for o in outputs]
        if self.options.stop_if_none_parse and all(r["judge/unparseable"] for r in results):
            raise _none_parsed(self.options, texts, outputs)
        return results

    def _params(self) -> SamplingParams:
        o = self.options
        return SamplingParams(max_new_tokens=o.max_new_tokens, temperature=o.temperature)


_backends: dict[str, JudgeBackend] = {}
# Raw reward_options -> their judge: later calls skip parsing and building.
_prepared: dict[str, Judge] = {}
_lock = threading.RLock()


@contextmanager
def _time_limit_paused() -> Iterator[None]:
    """Hold :func:`rewards.score_batch`'s ``SIGALRM`` limit while the judge is set up.

    Importing the engines, loading a model and starting a server are one-time costs
    of the process, not of scoring this batch: counting them would time out the first
    batch, and an import cut short leaves its module half-initialised.
    """
    can_hold = (
        hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    remaining = signal.setitimer(signal.ITIMER_REAL, 0)[0] if can_hold else 0.0
    try:
        yield
    finally:
        if remaining > 0:
            signal.setitimer(signal.ITIMER_REAL, remaining)


def get_backend(options: JudgeOptions) -> JudgeBackend:
    """The judge model for ``options``, built on first use and kept for the process.

    Raises:
        JudgeError: building it failed (the model does not load, a server does not
            start); the message names the judge and the cause.
    """
    key = options.engine_key()
    with _lock:
        if key not in _backends:
            with _time_limit_paused():
                try:
                    _backends[key] = JudgeBackend(options)
                except Exception as exc:
                    raise JudgeError(
                        f"{options.label()} could not be built: {type(exc).__name__}: {exc}"
                    ) from exc
        return _backends[key]


def prepare(options: Mapping[str, Any]) -> Judge:
    """The judge for ``reward_options``: the first call per options parses them and
    builds (or reuses) the model, outside the reward's time limit; later ones look it up.

    Raises:
        ValueError: bad options.
        JudgeError: the judge model could not be built.
    """
    key = json.dumps(dict(options), sort_keys=True, default=repr)
    with _lock:
        if key not in _prepared:
            with _time_limit_paused():
                parsed = parse_options(options)
                _prepared[key] = Judge(parsed, get_backend(parsed))
        return _prepared[key]


@atexit.register
def close_judges() -> None:
    """Close every judge model built in this process (their engines and servers)."""
    with _lock:
        _prepared.clear()
        while _backends:
            _backends.popitem()[1].close()


def _none_parsed(options: JudgeOptions, texts: Sequence[str], outputs: Sequence[str]) -> JudgeError:
    return JudgeError(
        f"{options.label()}: none of the {len(outputs)} replies of this batch has a grade "
        f"matching pattern {options.pattern!r}; e.g. to the prompt "
        f"{texts[0][-OUTPUT_CHARS:]!r} the judge wrote {outputs[0][:OUTPUT_CHARS]!r}. Make the "
        f"template ask for what the pattern reads (or fix the pattern, or the model), or set "
        f"stop_if_none_parse=False to score such replies default_score"
    )


@REWARDS.register(
    NAME,
    batched=True,
    summary="a language model grades each response with a prompt template; the grade is parsed",
    check_options=check_options,
)
def generative_judge(contexts: Sequence[RewardContext], **options: Any) -> list[dict[str, Any]]:
    """Grade every response with the judge model; one result per context, in order.

    Args:
        contexts: the responses to grade, with their prompts and references.
        **options: ``DataConfig.reward_options`` (see :class:`JudgeOptions`).

    Returns:
        Per row ``{"score", "judge/unparseable", "judge/output"}``, plus ``"judge/grade"``
        (the raw grade) when it parsed: ``score`` is the scaled grade, or
        ``default_score`` when the reply had none.

    Raises:
        ValueError: bad options.
        JudgeError: the judge could not be built, or (with ``stop_if_none_parse``) no
            reply of the batch has a grade.
    """
    if not contexts:
        return []
    return prepare(options).grade(contexts)
