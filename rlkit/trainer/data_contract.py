"""What a run can supply to its estimator, policy loss and roles, and which roles supply it.

Every tensor a registered function or a role reads is named once, and the name is the
same everywhere: the batch field or extra (``batch.get(name)``), the ``inputs=(...)`` of
a registered estimator or loss, a role's ``provides`` / ``inputs``, and the docs.

Two sources make up a run's table of inputs:

- :data:`BATCH_INPUTS`: what every batch carries after the rollout (and, for a loss,
  what the estimator and the update's own forward add, :data:`LOSS_INPUTS`);
- every role's ``provides``: the reference policy's ``ref_log_prob``, the critic's
  ``values``, PRIME's ``process_rewards``, a user role's own.

:func:`plan_roles` resolves the inputs the configured pieces declare to the roles that
provide them, in an order where each provider runs before its readers. It reads only
the configuration and the registries (role classes, estimator and loss entries), so an
input nobody provides is a configuration error, found before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

BATCH_INPUTS: dict[str, str] = {
    "rollout_log_prob": "the rollout engine's log-probs of the sampled tokens (B, T)",
    "policy_version": "version of the weights that sampled each token (B, T) long, -1 elsewhere",
    "token_level_scores": "the outcome score on each response's last sampled token, plus "
    "per-token environment rewards (B, T)",
    "scores": "the outcome score per response (B,)",
    "acc": "correctness per response (B,)",
    "response_lengths": "real tokens per response (B,) long",
    "prompt_lengths": "real tokens per prompt (B,) long",
}
"""Tensors every batch has, for an estimator, a loss or a role to declare."""

LOSS_INPUTS: dict[str, str] = {
    "entropy": "the current policy's entropy (B, T), with gradient",
    "returns": "the estimator's returns (B, T)",
    "token_level_rewards": "rewards per token after the KL penalty in the reward (B, T)",
}
"""Tensors a policy loss may declare beside :data:`BATCH_INPUTS`: they exist only once
the advantages are computed (or, ``entropy``, in the update's own forward)."""

FIRST_ROLE = "actor"
"""The policy: always built, always first (its weights serve the rollout)."""

BUILT_IN_ORDER = ("reference", "critic", "implicit_prm", "reward_model")
"""Where rlkit's own roles run when a run needs them, before the user's roles."""


class DataContractError(ValueError):
    """A declared input nobody provides, a role that did not provide what it declared,
    or role options its options type rejects."""


@dataclass(frozen=True)
class Reader:
    """Something of the run that reads inputs by name (for messages and resolution)."""

    label: str
    inputs: tuple[str, ...]
    built_in: dict[str, str] = field(default_factory=lambda: dict(BATCH_INPUTS))


@dataclass(frozen=True)
class RolePlan:
    """The roles a run builds, in the order of their forward passes, and who provides what.

    Attributes:
        roles: role names (``ROLES`` names or ``path/to/file.py:Class``), the actor first,
            each provider before the roles that read what it provides.
        providers: input name -> the name of the role that provides it.
        required: input name -> labels of what reads it (checked after each forward).
    """

    roles: tuple[str, ...]
    providers: dict[str, str]
    required: dict[str, tuple[str, ...]]


def registered_inputs(entry: Any) -> tuple[str, ...]:
    """The ``inputs=(...)`` a registry entry declared."""
    return tuple(entry.extra.get("inputs", ()))


def readers(config: Any) -> list[Reader]:
    """What the algorithm's registered pieces and settings read, in the order the
    messages name them."""
    from rlkit.registry import ESTIMATORS, POLICY_LOSSES

    a = config.algorithm
    estimator, loss = ESTIMATORS.entry(a.adv_estimator), POLICY_LOSSES.entry(a.policy_loss)
    wanted = registered_inputs(estimator)
    if estimator.extra.get("needs_values"):
        wanted = ("values", *wanted)
    out = []
    if a.use_kl_loss:
        out.append(Reader("AlgorithmConfig.use_kl_loss", ("ref_log_prob",)))
    if a.use_kl_in_reward:
        out.append(Reader("AlgorithmConfig.use_kl_in_reward", ("ref_log_prob",)))
    out.append(Reader(f"advantage estimator {a.adv_estimator!r}", wanted))
    loss_built_in = BATCH_INPUTS | LOSS_INPUTS
    out.append(Reader(f"policy loss {a.policy_loss!r}", registered_inputs(loss), loss_built_in))
    return out


def _role(name: str) -> Any:
    """The role class registered (or found by file path) under ``name``."""
    from rlkit.registry import ROLES

    return ROLES.get(name)


def _provided_by(cls: Any) -> tuple[str, ...]:
    return tuple(getattr(cls, "provides", ()))


def _read_by(cls: Any) -> tuple[str, ...]:
    return tuple(getattr(cls, "inputs", ()))


def _built_in_providers() -> dict[str, str]:
    """Input name -> the built-in role that provides it."""
    return {n: role for role in BUILT_IN_ORDER for n in _provided_by(_role(role))}


def plan_roles(config: Any) -> RolePlan:
    """Resolve what the run reads to the roles that provide it (see the module docs).

    Raises:
        DataContractError: an input nobody provides, one provided twice, a role that
            provides a batch field's name, or providers that read each other in a cycle.
    """
    problems, plan = _plan(config)
    if problems:
        raise DataContractError("\n".join(problems))
    return plan


def input_problems(config: Any) -> list[str]:
    """The configuration's data-contract problems (empty when it resolves), then those of
    its role options (:func:`role_options_problems`). Nothing is checked while
    ``AlgorithmConfig.roles`` or ``role_options`` has the wrong type: their own field
    rules report that."""
    a = config.algorithm
    if not isinstance(a.roles, (tuple, list)) or not isinstance(a.role_options, dict):
        return []
    problems = _plan(config)[0]
    return problems + role_options_problems(config)


def _plan(config: Any) -> tuple[list[str], RolePlan]:
    a = config.algorithm
    chosen = [FIRST_ROLE]
    if config.reward_model.path:
        chosen.append("reward_model")
    chosen += [r for r in a.roles if r not in chosen]
    problems: list[str] = []
    providers = _providers(chosen, problems)
    fallback = _built_in_providers()
    required: dict[str, list[str]] = {}
    pending = readers(config) + [Reader(f"role {r!r}", _read_by(_role(r))) for r in chosen]
    while pending:
        reader = pending.pop(0)
        built_in = reader.built_in
        for name in reader.inputs:
            if name in built_in and name not in providers:
                continue
            required.setdefault(name, []).append(reader.label)
            if name in providers:
                continue
            if name not in fallback:
                problems.append(_missing(name, reader, providers, built_in))
                continue
            role = fallback[name]
            chosen.append(role)
            providers |= {n: role for n in _provided_by(_role(role)) if n not in providers}
            pending.append(Reader(f"role {role!r}", _read_by(_role(role))))
    ordered = _ordered(chosen, providers, problems)
    plan = RolePlan(ordered, providers, {k: tuple(v) for k, v in required.items()})
    return problems, plan


def _providers(roles: list[str], problems: list[str]) -> dict[str, str]:
    """Input name -> the configured role that provides it, with clashes reported."""
    out: dict[str, str] = {}
    reserved = BATCH_INPUTS | LOSS_INPUTS
    for role in roles:
        for name in _provided_by(_role(role)):
            if name in reserved:
                problems.append(
                    f"role {role!r} provides {name!r}, the name of a tensor every batch "
                    f"has ({reserved[name]}): give its tensor another name"
                )
            elif name in out:
                problems.append(
                    f"{name!r} is provided by both role {out[name]!r} and role {role!r}: "
                    "keep one of them in AlgorithmConfig.roles"
                )
            else:
                out[name] = role
    return out


def _missing(name: str, reader: Reader, providers: dict[str, str], built_in: dict) -> str:
    available = sorted(set(built_in) | set(providers) | set(_built_in_providers()))
    return (
        f"{reader.label} reads the input {name!r}, which nothing in this run provides; "
        f"available: {available}. Add a role that provides it (a Role with "
        f"provides = ({name!r},), named in AlgorithmConfig.roles), or declare one of "
        "the available names"
    )


def _ordered(roles: list[str], providers: dict[str, str], problems: list[str]) -> tuple:
    """``roles`` with the actor first, rlkit's roles in :data:`BUILT_IN_ORDER`, the rest
    as configured, then moved so that each runs after the roles it reads from."""
    rank = {r: i for i, r in enumerate(BUILT_IN_ORDER)}
    rest = sorted(
        (r for r in dict.fromkeys(roles) if r != FIRST_ROLE),
        key=lambda r: (0, rank[r]) if r in rank else (1, roles.index(r)),
    )
    placed = [FIRST_ROLE]
    while rest:
        ready = next((r for r in rest if _sources(r, providers) <= set(placed)), None)
        if ready is None:
            problems.append(
                f"roles {rest} read each other's inputs in a cycle: "
                + "; ".join(f"{r!r} reads {sorted(_sources(r, providers))}" for r in rest)
            )
            return (*placed, *rest)
        placed.append(ready)
        rest.remove(ready)
    return tuple(placed)


def _sources(role: str, providers: dict[str, str]) -> set[str]:
    """The roles whose extras ``role`` reads."""
    return {providers[n] for n in _read_by(_role(role)) if n in providers} - {role}


def role_options_problems(config: Any) -> list[str]:
    """Options given to a role that is not in the run, or that its ``options_type``
    rejects (an unknown or missing field)."""
    a = config.algorithm
    problems = []
    for name, options in a.role_options.items():
        if not isinstance(options, dict):
            problems.append(
                f"AlgorithmConfig.role_options[{name!r}] must be a dict of the role's "
                f"options, got {type(options).__name__} {options!r}"
            )
        elif name not in a.roles:
            problems.append(
                f"AlgorithmConfig.role_options names {name!r}, which is not in "
                f"AlgorithmConfig.roles {list(a.roles)}: add it there, or remove its options"
            )
        else:
            try:
                role_options(_role(name), options)
            except DataContractError as exc:
                problems.append(str(exc))
    return problems


def role_options(cls: Any, options: dict[str, Any]) -> Any:
    """``options`` as the role's ``options_type`` (a dataclass), or as a dict when the
    role declares none.

    Raises:
        DataContractError: a field the dataclass does not have, or a required one missing.
    """
    kind = getattr(cls, "options_type", None)
    if kind is None:
        return dict(options)
    if not is_dataclass(kind):
        raise DataContractError(f"{cls.__name__}.options_type must be a dataclass, got {kind!r}")
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(options) - known)
    label = f"AlgorithmConfig.role_options for {cls.__name__}"
    if unknown:
        raise DataContractError(
            f"{label}: unknown option(s) {unknown}; {kind.__name__} has {sorted(known)}"
        )
    try:
        return kind(**options)
    except TypeError as exc:
        raise DataContractError(f"{label}: {exc}") from None


def check_provided(role: str, cls: Any, batch: Any, plan: RolePlan) -> None:
    """After ``role``'s forward: each tensor it declared and stored has the batch's shape,
    and each one something in the run reads is there.

    Raises:
        DataContractError: naming the role, the tensor and what reads it.
    """
    from rlkit.trainer.batch import extra_problem

    rows, width = len(batch), batch.responses.shape[1]
    for name in _provided_by(cls):
        if name in batch.extras:
            problem = extra_problem(name, batch.extras[name], rows, width)
            if problem:
                raise DataContractError(f"role {role!r}: {problem}")
        elif plan.providers.get(name) == role and name in plan.required:
            raise DataContractError(
                f"role {role!r} declares provides {name!r}, but its forward did not store "
                f"batch.extras[{name!r}], which {' and '.join(plan.required[name])} read"
            )
