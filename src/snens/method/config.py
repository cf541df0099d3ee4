"""One configuration object for σN-Ens: what ``convert`` builds and what training uses.

    config = snens.SnensConfig(num_members=4, temperature=5.0, diversity_weight=0.01,
                               input_policy="split")
    ens = snens.convert(model, config)       # ens.snens_config == config
    loss = snens.training_loss(ens, ens(x), y).total  # τ and λ from ens.snens_config
    groups = snens.param_groups(ens, lr=3e-3)              # γ's lr multiplier from ens.snens_config

It is the engine's ``[method]`` table for σN-Ens, and every save writes it beside the weights
and reads it back, so a reloaded ensemble trains on as the saved one did.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any, Literal

from snens.method.optim import GAMMA_LR_MULTIPLIER
from snens.method.regularizer import (
    DEFAULT_DIVERSITY_WEIGHT,
    DEFAULT_TEMPERATURE,
    _check_temperature,
    _check_weight,
)
from snens.nn.norms import check_num_members

__all__ = ["SnensConfig"]


@dataclass(frozen=True)
class SnensConfig:
    """Everything σN-Ens needs beyond the model: members, diversity, inputs, γ, which layers.

    Attributes:
        num_members: M, from 1 to :data:`snens.nn.norms.MAX_MEMBERS`.
        temperature: τ of the diversity regularizer, > 0 (:func:`snens.optimal_k`).
        diversity_weight: λ, ≥ 0; 0 trains on the task loss alone.
        input_policy: ``"repeat"`` or ``"split"`` in training; evaluation always repeats.
        gamma_lr_multiplier: γ's learning rate over the base one, ≥ 0.
        gamma_mean, gamma_std: γ ~ N(gamma_mean, gamma_std²) at conversion.
        head, head_init, skip_unsupported: as :func:`snens.convert`'s.
        norms: which norms convert: ``None`` (all), a regular expression, or a tuple of names
            or name endings (a function goes to :func:`snens.convert` itself).

    Raises:
        TypeError: a field of the wrong type; a function as ``norms``.
        ValueError: a field outside its range or choices.
    """

    num_members: int = 4
    temperature: float = DEFAULT_TEMPERATURE
    diversity_weight: float = DEFAULT_DIVERSITY_WEIGHT
    input_policy: Literal["repeat", "split"] = "repeat"
    gamma_lr_multiplier: float = GAMMA_LR_MULTIPLIER
    gamma_mean: float = 0.0
    gamma_std: float = 1.0
    head: str | None = "auto"
    head_init: Literal["copy", "reset"] = "copy"
    norms: str | tuple[str, ...] | None = None
    skip_unsupported: bool | None = None

    def __post_init__(self) -> None:
        check_num_members(self.num_members)
        object.__setattr__(self, "temperature", _check_temperature(self.temperature))
        object.__setattr__(self, "diversity_weight", _check_weight(self.diversity_weight))
        for name in ("gamma_lr_multiplier", "gamma_mean", "gamma_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a real number, got {value!r:.60}")
            object.__setattr__(self, name, float(value))
        if not math.isfinite(self.gamma_lr_multiplier) or self.gamma_lr_multiplier < 0:
            raise ValueError(
                f"gamma_lr_multiplier must be a number >= 0, got {self.gamma_lr_multiplier!r}"
            )
        if not (math.isfinite(self.gamma_mean) and math.isfinite(self.gamma_std)) or (
            self.gamma_std < 0
        ):
            raise ValueError(
                f"gamma_mean={self.gamma_mean} and gamma_std={self.gamma_std} must be finite, "
                "gamma_std >= 0"
            )
        _choice(self, "input_policy", ("repeat", "split"))
        _choice(self, "head_init", ("copy", "reset"))
        if isinstance(self.norms, list):  # a list read from JSON or TOML: kept as a tuple
            object.__setattr__(self, "norms", tuple(self.norms))
        if callable(self.norms):
            raise TypeError(
                "a SnensConfig holds plain data: pass a function choosing the norms to "
                "snens.convert(model, config, norms=...) itself"
            )
        _plain_fields(self)

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON/TOML data.

        Returns:
            ``{field: value}`` for every field, ``norms`` a list.
        """
        out = dataclasses.asdict(self)
        if isinstance(self.norms, tuple):
            out["norms"] = list(self.norms)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SnensConfig:
        """The config a :meth:`to_dict` holds; missing keys default.

        Returns:
            The checked config.

        Raises:
            TypeError: ``values`` is not a mapping, or a value of the wrong type.
            ValueError: an unknown key (the nearest field suggested), or a value out of range.
        """
        if not isinstance(values, dict):
            raise TypeError(f"a SnensConfig is read from a dict, got {type(values).__name__}")
        fields = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in fields:
                near = difflib.get_close_matches(str(key), fields, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else f"; the fields: {fields}"
                raise ValueError(f"SnensConfig has no field {key!r}{hint}")
        return cls(**values)

    def replace(self, **changes: Any) -> SnensConfig:
        """A copy with ``changes`` applied (and checked).

        Returns:
            The new config.

        Raises:
            ValueError: an unknown field, or a value out of range.
            TypeError: a value of the wrong type.
        """
        return type(self).from_dict({**self.to_dict(), **changes})


def _choice(config: SnensConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{name} must be {' or '.join(map(repr, choices))}, got {value!r:.60}")


def saved_config(meta: dict[str, Any]) -> SnensConfig:
    """The config a save's ``snens.json`` (``meta``) holds; an old save without one gives one
    of its M and input policy.

    Raises:
        ValueError: the config is not a SnensConfig's, or disagrees with M or the input policy.
    """
    if "config" not in meta:
        return SnensConfig(num_members=meta["num_members"], input_policy=meta["input_policy"])
    try:
        config = SnensConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"its config is not a SnensConfig ({error})") from None
    if (config.num_members, config.input_policy) != (meta["num_members"], meta["input_policy"]):
        raise ValueError(
            f"its config (num_members={config.num_members}, input_policy="
            f"{config.input_policy!r}) disagrees with num_members={meta['num_members']}, "
            f"input_policy={meta['input_policy']!r}"
        )
    return config


def _plain_fields(config: SnensConfig) -> None:
    """The fields :func:`snens.convert` reads as given: a damaged ``snens.json`` is refused
    where it is read, not at the next conversion."""
    if not (config.head is None or isinstance(config.head, str)):
        raise TypeError(f"head must be 'auto', a module name or None, got {config.head!r:.60}")
    norms = config.norms
    if not (norms is None or isinstance(norms, str)) and not (
        isinstance(norms, tuple) and all(isinstance(name, str) for name in norms)
    ):
        raise TypeError(
            "norms must be None (all), a regular expression or a list of module names, got "
            f"{norms!r:.60}"
        )
    if not (config.skip_unsupported is None or isinstance(config.skip_unsupported, bool)):
        raise TypeError(
            f"skip_unsupported must be None, True or False, got {config.skip_unsupported!r:.60}"
        )
