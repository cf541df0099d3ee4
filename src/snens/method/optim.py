"""Parameter groups by one visible rule: gamma apart, no weight decay on norms and biases.

gamma gets a larger learning rate (at the base one no allocation forms) and no weight decay
(which pulls sigmoid(gamma) to 0.5 and fights the regularizer).
"""

from __future__ import annotations

from torch import nn

from snens.nn.norms import MemberNorm
from snens.nn.registry import is_norm

__all__ = ["GAMMA_LR_MULTIPLIER", "param_groups"]

#: Default learning-rate multiplier of gamma, chosen on validation for training from scratch;
#: a short fine-tune of a pretrained network wants less.
GAMMA_LR_MULTIPLIER = 30.0


def param_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    gamma_lr_multiplier: float | None = None,
    affine_weight_decay: float = 0.0,
) -> list[dict]:
    """Optimizer parameter groups for a σN-Ens model (or any model), each parameter once:

    * ``gamma`` of a member norm -> "gamma": lr × gamma_lr_multiplier, no weight decay;
    * where ``affine_weight_decay`` > 0, a member norm's ``weight`` and ``bias`` ->
      "member_affine": lr, that decay;
    * other parameters of norm layers, and every bias -> "no_decay";
    * everything else -> "decay", with ``weight_decay``.

    ``gamma_lr_multiplier`` None: the ``snens_config``'s, or :data:`GAMMA_LR_MULTIPLIER`.

    Returns:
        Non-empty groups as dicts for ``torch.optim``, each with a "name" key.

    Raises:
        ValueError: on a negative or non-finite lr, weight decay or multiplier.
    """
    if gamma_lr_multiplier is None:
        config = getattr(model, "snens_config", None)
        gamma_lr_multiplier = GAMMA_LR_MULTIPLIER if config is None else config.gamma_lr_multiplier
    rates = {"lr": lr, "weight_decay": weight_decay, "gamma_lr_multiplier": gamma_lr_multiplier}
    for name, value in {**rates, "affine_weight_decay": affine_weight_decay}.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if value == float("inf"):
            raise ValueError(f"{name} must be finite, got {value!r}")
    settings = {  # name -> (lr, weight decay), in the order the groups are returned
        "decay": (lr, weight_decay),
        "no_decay": (lr, 0.0),
        "gamma": (lr * gamma_lr_multiplier, 0.0),
        "member_affine": (lr, affine_weight_decay),
    }
    groups: dict[str, list] = {name: [] for name in settings}
    seen: set[int] = set()
    for module in model.modules():
        member = isinstance(module, MemberNorm)
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if member and pname == "gamma":
                groups["gamma"].append(p)
            elif member and affine_weight_decay > 0:
                groups["member_affine"].append(p)
            elif is_norm(module) or pname == "bias":
                groups["no_decay"].append(p)
            else:
                groups["decay"].append(p)
    return [
        {"name": name, "params": params, "lr": settings[name][0], "weight_decay": settings[name][1]}
        for name, params in groups.items()
        if params
    ]
