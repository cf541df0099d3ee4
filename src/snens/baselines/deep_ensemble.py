"""Deep ensembles (Lakshminarayanan et al., 2017): M independently initialized copies of a model.

The members share nothing and are trained jointly (one optimizer, the mean of the members'
losses), which equals training them separately on the same batches. ``vectorize=True`` runs
them as one ``torch.func.vmap`` over ``functional_call`` (same outputs, gradients and
statistics); the loop is the default, as vmap was no faster on the CPU.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from snens.method.ensemble import input_batch_size, is_per_example, split_size
from snens.nn.norms import check_num_members

__all__ = ["DeepEnsemble", "reinitialized_copy"]


def _logits(out: Any) -> Tensor:
    logits = getattr(out, "logits", out)  # Hugging Face ModelOutput
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    if not isinstance(logits, Tensor):
        raise TypeError(f"cannot find logits in a member's output of type {type(out).__name__}")
    return logits


def reinitialized_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` with every submodule's ``reset_parameters()`` called (PyTorch's
    default initialization, not a model's own rule).

    Returns:
        The new module, of ``model``'s class.
    """
    fresh = copy.deepcopy(model)
    for module in fresh.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
    return fresh


class DeepEnsemble(nn.Module):
    """M independent models run on the same input: (B, …) -> logits (M, B, K).

    ``models`` is a sequence of modules, or a zero-argument callable called ``num_members`` times,
    each call under its own seed ``seed + m`` (None: drawn from the global generator, whose state
    is left untouched). ``vectorize`` runs the members with ``torch.func.vmap`` instead of a loop.
    With ``input_policy="split"`` (training only) member m runs on the m-th of M equal blocks of
    the batch's rows, output (M, B/M, K).

    Raises:
        TypeError: if ``models`` is neither a sequence of modules nor a callable.
        ValueError: on an empty sequence, a missing or inconsistent ``num_members``, an unknown
            ``input_policy``, or ``split`` with ``vectorize``.
    """

    def __init__(
        self,
        models: Sequence[nn.Module] | Callable[[], nn.Module],
        num_members: int | None = None,
        *,
        seed: int | None = None,
        vectorize: bool = False,
        input_policy: str = "repeat",
    ) -> None:
        super().__init__()
        if input_policy not in ("repeat", "split"):
            raise ValueError(f"input_policy must be 'repeat' or 'split', got {input_policy!r}")
        if input_policy == "split" and vectorize:
            raise ValueError(
                "input_policy='split' runs the members in a loop, each on its own rows; "
                "leave vectorize=False"
            )
        self.input_policy = input_policy
        if isinstance(models, nn.Module):
            raise TypeError(
                "DeepEnsemble takes a list of models or a factory; to ensemble copies of one "
                "model pass [model, …] or DeepEnsemble(lambda: build(), num_members=M)"
            )
        if callable(models):
            if num_members is None:
                raise ValueError(
                    "DeepEnsemble(factory) needs num_members, e.g. DeepEnsemble(factory, 4)"
                )
            check_num_members(num_members)
            if seed is None:
                seed = int(torch.randint(0, 2**31 - 1, (), device="cpu").item())
            members = []
            for m in range(num_members):
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed + m)
                    members.append(models())
        else:
            members = list(models)
            if not members or not all(isinstance(m, nn.Module) for m in members):
                raise TypeError("DeepEnsemble expects a non-empty sequence of nn.Module members")
            if num_members is not None and num_members != len(members):
                raise ValueError(
                    f"num_members={num_members} but {len(members)} models were given; pass "
                    f"num_members={len(members)} or leave it out"
                )
        self.members = nn.ModuleList(members)
        self.num_members = len(self.members)
        self.seed = seed
        self.vectorize = vectorize

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        if self.training and self.input_policy == "split":
            return self._forward_split(args, kwargs)
        if self.vectorize and self.num_members > 1:
            return self._forward_vmap(args, kwargs)
        return torch.stack([_logits(m(*args, **kwargs)) for m in self.members])  # (M, B, K)

    def _forward_split(self, args: tuple, kwargs: dict) -> Tensor:
        """Member m on the m-th block of rows of every per-example tensor: (M, B/M, K)."""
        B = input_batch_size(args, kwargs)
        b = split_size(B, self.num_members)

        def block(value: Any, m: int) -> Any:
            return value[m * b : (m + 1) * b] if is_per_example(value, B) else value

        outputs = []
        for m, member in enumerate(self.members):
            member_kwargs = {k: block(v, m) for k, v in kwargs.items()}
            outputs.append(_logits(member(*(block(a, m) for a in args), **member_kwargs)))
        return torch.stack(outputs)  # (M, B/M, K)

    def _forward_vmap(self, args: tuple, kwargs: dict) -> Tensor:
        names = [n for n, _ in self.members[0].named_parameters()]
        buffer_names = [n for n, _ in self.members[0].named_buffers()]
        states = [(dict(m.named_parameters()), dict(m.named_buffers())) for m in self.members]
        params = {n: torch.stack([p[n] for p, _ in states]) for n in names}
        buffers = {n: torch.stack([b[n] for _, b in states]) for n in buffer_names}
        skeleton = self._skeleton()

        def member(p: dict, b: dict, *a: Any) -> Tensor:
            return _logits(functional_call(skeleton, (p, b), a, kwargs))

        in_dims = (0, 0, *(None,) * len(args))
        out = vmap(member, in_dims=in_dims, randomness="different")(params, buffers, *args)
        if self.training and buffers:
            with torch.no_grad():  # BatchNorm updated the stacked copies: write them back
                for n in buffer_names:
                    for m, (_, own) in enumerate(states):
                        own[n].copy_(buffers[n][m])
        return out  # (M, B, K)

    def _skeleton(self) -> nn.Module:
        # a parameter-free copy of member 0, kept out of the module tree (and the state_dict)
        skeleton = self.__dict__.get("_skeleton_module")
        if skeleton is None:
            skeleton = copy.deepcopy(self.members[0]).to("meta")
            self.__dict__["_skeleton_module"] = skeleton
        return skeleton.train(self.training)

    def extra_repr(self) -> str:
        split = ", input_policy='split'" if self.input_policy == "split" else ""
        return f"num_members={self.num_members}, vectorize={self.vectorize}{split}"
