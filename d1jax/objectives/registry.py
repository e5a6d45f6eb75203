"""The GRPO objectives by name: one record per objective (``Objective``) holding every fact
that other modules need of it, and the registry of those records.

The update (``d1jax.train.pure_steps``) takes the record's ``loss``, ``prepare`` and ``logps``;
the config builders its knobs, default beta and ``:authors`` recipe
(``d1jax.config.defaults.grpo``); the spec its hyper-parameters and the families it runs on
(``d1jax.run.spec``); the planner its estimator's cost (``d1jax.plan``). None of them asks
which objective it has.

Built in: ``d1jax.objectives.table`` (diffu_grpo, wd1, coupled_grpo, spg, justgrpo,
tracerl). Another objective registers with ``register(Objective(...))`` from its own module;
a run names that module in ``$D1JAX_OBJECTIVE_MODULES`` (comma-separated, importable from
PYTHONPATH), imported when a config is built and when ``get`` is asked for an objective it
does not know yet (docs/objectives.md, "Adding an objective").
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from d1jax import plugins

# Modules that register objectives, imported by ``load_modules`` (comma-separated).
MODULES_ENV = "D1JAX_OBJECTIVE_MODULES"


@dataclasses.dataclass(frozen=True)
class Cost:
    """How the planner prices an objective's log-prob pass (``d1jax.plan.flops``)."""

    # "estimator": ``copies`` forwards of P + C a row, the head on C (flops.estimator);
    # "stream": one forward of the clean row and ``copies`` noised copies of its completion
    # (flops.stream_estimator); "ar": one forward per completion position, in chunks of
    # ``chunk`` rows, rematerialised in the update, head included (flops.ar_estimator).
    layout: str = "estimator"
    copies: int = 1
    chunk: int = 0


@dataclasses.dataclass(frozen=True)
class Objective:
    """One policy loss of the GRPO loop and every fact the rest of the package needs of it.

    ``cfg`` is the run's ``GRPOConfig`` (``d1jax.objectives.table``), ``cfg.hparams`` the
    objective's own config (an instance of ``hparams``)."""

    name: str  # config.grpo.objective
    # (model, cfg, params, rows of one micro-batch, mask seed [1], dropout rng) -> (loss, metrics);
    # a ratio objective also takes ``old_is_current`` (``losses.grpo_loss``).
    loss: Callable[..., tuple[Any, dict]]
    # (model, cfg, rows of the whole batch, mask key) -> rows with the update's draws, made on
    # the whole batch before the micro-batch split.
    prepare: Callable[..., Any]
    # (model, cfg, params, batch, mask seeds [S], use_lora) -> [S, B, C] old/ref log-probs;
    # None: ratio-free, no old or reference pass (grpo.beta must be 0).
    logps: Callable[..., Any] | None
    hparams: type | None = None  # class of ``cfg.hparams`` (None: no own config)
    default_hparams: bool = False  # ``cfg.hparams`` None means ``hparams()``, its defaults.
    # Its own knobs, the group config.grpo.<name> (a ``d1jax.knobs.frozen`` class declared next
    # to its module), and that group's one-line meaning (docs/configs.md).
    knobs: type | None = None
    doc: str = ""
    # (config.grpo translated: a GRPOSpec whose ``<name>`` is the knobs above, the rollout
    # SamplerConfig) -> ``cfg.hparams``; shared knobs (G, prompt noise, block length) come from
    # the fields the loop uses. ValueError for a bad combination (one ConfigError line).
    make_hparams: Callable[[Any, Any], Any] | None = None
    # (hparams, grpo beta, grpo epsilon) -> None, ValueError when the shared knobs disagree.
    check: Callable[[Any, float, float], None] | None = None
    # config.grpo.beta the builders set; None: 0 when ratio-free, else d1's 0.04.
    beta: float | None = None
    # The ``:authors`` variant: (ConfigDict, tiny) -> None, setting the knobs its authors ran
    # with where they differ from d1's (None: no such variant).
    authors: Callable[[Any, bool], None] | None = None
    trace: bool = False  # rows carry the rollout's trace: per_row["decoded_at"] [B, C].
    # The model families it is adapted to (config.model.family); None: every family.
    families: tuple[str, ...] | None = None
    # Planner: (cfg, completion length or None) -> forward rows per completion row of its
    # log-prob estimate (None: d1's one, two under classifier-free guidance).
    rows: Callable[[Any, int | None], int] | None = None
    # Planner: (model, cfg, completion length) -> its FLOP model (None: Cost("estimator",
    # the rows above)).
    cost: Callable[[Any, Any, int], Cost] | None = None
    # Planner: (hparams, rows, prompt, completion) -> hparams with the automatic chunk an
    # accelerator picks, where the objective has its own (None: nothing to set).
    on_accelerator: Callable[[Any, int, int, int], Any] | None = None
    paper: str = ""  # arXiv id of the paper it implements (lists name objectives oldest first)

    @property
    def ratio_free(self) -> bool:
        """No ratio to an old policy and no reference term (wd1, SPG)."""
        return self.logps is None

    @property
    def default_beta(self) -> float:
        return (0.0 if self.ratio_free else 0.04) if self.beta is None else self.beta

    def estimator_rows(self, cfg, completion: int | None = None) -> int:
        if self.rows is not None:
            return self.rows(cfg, completion)
        return 2 if cfg.cfg_scale > 0 else 1

    def flops_model(self, model, cfg, completion: int) -> Cost:
        if self.cost is not None:
            return self.cost(model, cfg, completion)
        return Cost("estimator", self.estimator_rows(cfg, completion))

    def check_family(self, family: str) -> None:
        """ValueError, one line naming both, unless it runs on ``family``."""
        if self.families is not None and family not in self.families:
            raise ValueError(f"objective {self.name!r} is not adapted to model family {family!r} "
                             f"(it runs on {', '.join(self.families)}); choose another "
                             f"grpo.objective or model family")


OBJECTIVES: dict[str, Objective] = {}


def by_paper(objectives) -> list[Objective]:
    """``objectives`` oldest paper first (those without one last, by name)."""
    return sorted(objectives, key=lambda o: (not o.paper, o.paper, o.name))


def register(objective: Objective) -> Objective:
    """Adds ``objective`` to the registry; registering the same record again is a no-op,
    another under a taken name a ValueError."""
    known = OBJECTIVES.get(objective.name)
    if known is not None and known != objective:
        raise ValueError(f"objective {objective.name!r} is already registered")
    if (objective.knobs is None) != (objective.make_hparams is None) or (
            objective.knobs is not None and not objective.doc):
        raise ValueError(f"objective {objective.name!r}: knobs, doc and make_hparams go "
                         "together")
    OBJECTIVES[objective.name] = objective
    return objective


def load_modules() -> None:
    """Imports the built-in objectives and the modules named in ``$D1JAX_OBJECTIVE_MODULES``."""
    importlib.import_module("d1jax.objectives.table")
    plugins.import_named(MODULES_ENV, "objective")


def get(name: str) -> Objective:
    """The objective called ``name``; ValueError listing the known ones."""
    if name not in OBJECTIVES:
        load_modules()
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"objective={name!r}: choose one of {sorted(OBJECTIVES)}") from None
