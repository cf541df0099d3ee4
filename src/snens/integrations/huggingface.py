"""A Hugging Face ``Trainer`` for σN-Ens ensembles.

    trainer = SnensTrainer(model=snens.convert(model, num_members=4), args=TrainingArguments(...),
                           train_dataset=..., temperature=1.0, diversity_weight=0.1)
    trainer.train()

It trains on :func:`snens.method.step.training_loss` over :func:`snens.param_groups`, evaluates
the members' mean softmax (``eval_loss`` its NLL), and saves ``snens.json`` beside the weights,
which :func:`load_ensemble` reads::

    ens = load_ensemble(AutoModelForSequenceClassification.from_pretrained(name), "my-ensemble")

Needs ``transformers`` and ``accelerate``: ``pip install 'snens[huggingface]'``.
"""

from __future__ import annotations

import importlib.util
import inspect
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import transformers
except ImportError as error:
    raise ImportError(
        "snens.integrations.huggingface needs transformers and accelerate: "
        "pip install 'snens[huggingface]'"
    ) from error
if importlib.util.find_spec("accelerate") is None:
    raise ImportError(
        "snens.integrations.huggingface needs accelerate (transformers.Trainer runs on it): "
        "pip install 'snens[huggingface]'"
    )

import torch
from torch import Tensor, nn

from snens import files
from snens.integrations._saves import (
    check_meta,
    check_weights,
    load_safetensors,
    meta_copy,
    write_meta,
)
from snens.method.config import SnensConfig
from snens.method.convert import convert
from snens.method.ensemble import Ensemble, predictive_probs
from snens.method.optim import param_groups
from snens.method.regularizer import LayerSelection, diversity_gain, diversity_loss
from snens.method.step import check_finite, training_loss
from snens.metrics import nll
from snens.nn import (
    MemberBatchNorm1d,
    MemberBatchNorm2d,
    MemberBatchNorm3d,
    MemberLayerNorm,
    MemberLinear,
    fused,
)
from snens.nn.surgery import only_named

__all__ = ["FORMAT_VERSION", "SNENS_CONFIG", "SnensTrainer", "load_ensemble"]

#: The file ``SnensTrainer.save_model`` writes beside the weights: how to convert a fresh model.
SNENS_CONFIG = "snens.json"
#: The version of ``snens.json``.
FORMAT_VERSION = 1
# The weight files a Trainer save or a save_pretrained directory holds, in the order looked for.
_SAFETENSORS = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_PICKLED = "pytorch_model.bin"
# What SnensTrainer writes beside them (a save_pretrained directory has no such file).
_TRAINING_ARGS = "training_args.bin"
_MAX_JSON_BYTES = 64 * 2**20
_FUSABLE = (MemberLayerNorm, MemberBatchNorm1d, MemberBatchNorm2d, MemberBatchNorm3d)


class SnensTrainer(transformers.Trainer):
    """``transformers.Trainer`` training a :class:`snens.Ensemble` with the σN-Ens loss.

    ``args.learning_rate`` and ``weight_decay`` set the "decay" group, ``label_smoothing_factor``
    the label smoothing. ``temperature`` (τ), ``diversity_weight`` (λ; 0 trains on the task loss
    alone) and ``gamma_lr_multiplier`` (γ's learning rate over ``args.learning_rate``) default to
    the ensemble's ``snens_config``; ``diversity_layers`` picks the regularized member norms.

    Raises:
        TypeError: ``model`` is not a :class:`snens.Ensemble`.
        ValueError: ``compute_loss_func`` or ``model_init`` given, more than one label name, more
            than one GPU in one process, a ``label_smoothing_factor`` outside [0, 1), or a τ, λ or
            layer selection that :func:`snens.diversity_loss` refuses.
        NonFiniteLossError: while training, a NaN or infinite loss; nothing of that step is
            applied.
    """

    def __init__(
        self,
        model: Ensemble,
        args: transformers.TrainingArguments | None = None,
        *,
        temperature: float | None = None,
        diversity_weight: float | None = None,
        gamma_lr_multiplier: float | None = None,
        diversity_layers: LayerSelection = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(model, Ensemble):
            raise TypeError(
                f"SnensTrainer trains a snens.Ensemble, got {type(model).__name__}; build one "
                "with ens = snens.convert(model, num_members=4) and pass model=ens"
            )
        config = model.snens_config  # what is not given comes from it
        temperature = config.temperature if temperature is None else temperature
        diversity_weight = config.diversity_weight if diversity_weight is None else diversity_weight
        if gamma_lr_multiplier is None:
            gamma_lr_multiplier = config.gamma_lr_multiplier
        if kwargs.get("compute_loss_func") is not None:
            raise ValueError(
                "SnensTrainer computes the σN-Ens loss itself (ensemble_loss + diversity_loss); "
                "drop compute_loss_func, or subclass SnensTrainer and override compute_loss"
            )
        if kwargs.get("model_init") is not None:
            raise ValueError(
                "SnensTrainer takes the ensemble as model=; model_init is not supported: build "
                "the ensemble with snens.convert before creating the trainer"
            )
        with torch.no_grad():  # refuse a bad τ, λ or layer selection now, not at step 1
            diversity_loss(model, temperature, diversity_weight, diversity_layers)
        smoothing = 0.0 if args is None else args.label_smoothing_factor
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(
                f"TrainingArguments(label_smoothing_factor={smoothing!r}) must lie in [0, 1); "
                "0 trains on the hard labels"
            )
        self.temperature = temperature
        self.diversity_weight = diversity_weight
        self.gamma_lr_multiplier = gamma_lr_multiplier
        self.diversity_layers = diversity_layers
        # Trainer.__init__'s label smoother would read model.config, which an ensemble has not;
        # compute_loss smooths itself, so Trainer is shown 0 while it is built
        if smoothing:
            args.label_smoothing_factor = 0.0
        try:
            super().__init__(model=model, args=args, **kwargs)
        finally:
            if smoothing:
                args.label_smoothing_factor = smoothing
        # refuse a bad multiplier now, not when training builds the optimizer
        param_groups(model, self.args.learning_rate, self.args.weight_decay, gamma_lr_multiplier)
        if self.args.n_gpu > 1:
            raise ValueError(
                f"SnensTrainer sees {self.args.n_gpu} GPUs in one process, and "
                "torch.nn.DataParallel would gather the (M, B, K) logits along M; launch one "
                "process per GPU (torchrun --nproc_per_node=N) or make one GPU visible "
                "(CUDA_VISIBLE_DEVICES=0)"
            )
        # The ensemble's forward takes **kwargs, which Trainer reads as "accepts
        # num_items_in_batch"; the wrapped model would then receive it and fail.
        self.model_accepts_loss_kwargs = False
        names = list(self.args.label_names or ["labels"])
        if len(names) != 1:
            raise ValueError(
                f"SnensTrainer trains a classifier on one label column, got label_names={names}; "
                "pass TrainingArguments(label_names=['labels'])"
            )
        self.label_names = names
        # build the fused CPU kernels (a minute, once) now rather than in the first evaluate()
        if self.args.device.type == "cpu" and any(isinstance(m, _FUSABLE) for m in model.modules()):
            fused.available()

    def _set_signature_columns_if_needed(self) -> None:
        # Trainer keeps the columns named in model.forward's signature, "args" and "kwargs"
        # included; keep the wrapped model's named inputs only, and say so if it names none.
        if self._signature_columns is not None:
            return
        forward = self.accelerator.unwrap_model(self.model).model.forward
        variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        names = [
            n for n, p in inspect.signature(forward).parameters.items() if p.kind not in variadic
        ]
        if not names:
            raise ValueError(
                f"{type(self.model.model).__name__}.forward names no parameters, so the batch "
                "columns it uses are unknown; pass TrainingArguments(remove_unused_columns=False)"
            )
        self._signature_columns = [*names, *sorted({"label", "label_ids", *self.label_names})]

    def _split_labels(
        self, inputs: dict[str, Any], required: bool = True
    ) -> tuple[dict[str, Any], Tensor | None]:
        (name,) = self.label_names
        if required and inputs.get(name) is None:
            raise ValueError(
                f"the batch holds no {name!r} (keys: {sorted(inputs)}); give every example a "
                f"'label' or {name!r} entry, or name the label column with "
                "TrainingArguments(label_names=[...])"
            )
        return {k: v for k, v in inputs.items() if k != name}, inputs.get(name)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """The σN-Ens loss of a batch: the task loss in value, the total's in gradient, so that
        Trainer's backward, accumulation scaling and logged ``loss`` see the task.

        Raises:
            NonFiniteLossError: the loss is NaN or infinite, before the backward pass.
        """
        inputs, labels = self._split_labels(inputs)
        logits = model(**inputs)  # (M, B, K), or (M, B/M, K) with input_policy="split"
        ensemble = self.accelerator.unwrap_model(model)
        loss = training_loss(
            ensemble,
            logits,
            labels,
            temperature=self.temperature,
            weight=self.diversity_weight,
            layers=self.diversity_layers,
            label_smoothing=self.args.label_smoothing_factor,
            task_value=True,
        )
        steps = f" of {self.state.max_steps}" if self.state.max_steps else ""
        # One host sync per step (Trainer's NaN filter of the logged loss syncs as well): a
        # non-finite loss would turn every parameter NaN at the optimizer step.
        check_finite(
            loss,
            ensemble,
            inputs,
            where=f"step {self.state.global_step + 1}{steps}",
            temperature=self.temperature,
            remedy="lower learning_rate or set max_grad_norm",
            precision="bf16/fp16" if self.args.bf16 or self.args.fp16 else None,
        )
        return (loss.total, logits) if return_outputs else loss.total

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Adds ``diversity_gain`` (nats per feature) to the training log holding ``loss``."""
        if "loss" in logs:
            logs["diversity_gain"] = diversity_gain(
                self.accelerator.unwrap_model(self.model), self.temperature, self.diversity_layers
            )
        super().log(logs, *args, **kwargs)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Trainer's save (``save_model`` and checkpoints) of a model that is not a
        ``PreTrainedModel``, plus ``snens.json``: every file is written into one staged directory
        (:func:`snens.files.staged_directory`) and moved in once all were written, ``snens.json``
        last, so a full disk or a kill never leaves new weights beside an old ``snens.json``."""
        from safetensors.torch import save

        if not self.args.should_save:  # one process writes; an ensemble is never sharded
            return
        directory = Path(self.args.output_dir if output_dir is None else output_dir)
        ensemble = self.accelerator.unwrap_model(self.model)
        if state_dict is None:
            state_dict = ensemble.state_dict()
        data = save(_unshared(state_dict), metadata={"format": "pt"})
        arguments = io.BytesIO()
        torch.save(self.args, arguments)
        tokenizer = self.processing_class
        if tokenizer is None:
            tokenizer = getattr(self.data_collator, "tokenizer", None)
        config = getattr(ensemble.model, "config", None)  # a Hugging Face model's: config.json
        with files.staged_directory(directory, last=SNENS_CONFIG) as staging:
            mode = files.plain_mode(directory / _SAFETENSORS)
            files.write_bytes(staging / _SAFETENSORS, data, mode=mode)
            if tokenizer is not None:  # it writes its files by name
                tokenizer.save_pretrained(str(staging))
            if isinstance(config, transformers.PretrainedConfig):
                files.write_text(staging / "config.json", config.to_json_string())
            files.write_bytes(staging / _TRAINING_ARGS, arguments.getvalue())
            _write_config(ensemble, staging)

    def _load_from_checkpoint(
        self, resume_from_checkpoint: str, model: nn.Module | None = None
    ) -> None:
        """Trainer's resume (``train(resume_from_checkpoint=...)``) through the checks of
        :func:`load_ensemble`: a checkpoint of another M, ``norms=`` or ``head=`` is refused,
        naming the ``snens.convert`` call that fits it, before a weight is loaded."""
        if self._own_loader(resume_from_checkpoint):
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        else:
            self._load_checked(Path(resume_from_checkpoint), model)

    def _load_best_model(self) -> None:
        """Trainer's ``load_best_model_at_end``, through the checks of :func:`load_ensemble`."""
        if self._own_loader(self.state.best_model_checkpoint):
            super()._load_best_model()
        else:
            self._load_checked(Path(self.state.best_model_checkpoint), None)

    def _own_loader(self, directory: str) -> bool:
        """Whether Trainer's loader is left to load ``directory``: a sharded model (DeepSpeed,
        FSDP), or no weights there (Trainer says so in its words)."""
        sharded = getattr(self, "is_deepspeed_enabled", False) or getattr(
            self, "is_fsdp_enabled", False
        )
        names = (_SAFETENSORS, _SAFETENSORS_INDEX, _PICKLED)
        return sharded or not any(os.path.lexists(Path(directory) / n) for n in names)

    def _load_checked(self, where: Path, model: nn.Module | None) -> None:
        ensemble = self.accelerator.unwrap_model(self.model if model is None else model)
        state = _read_weights(where)
        meta, prefix = _read_config(where, state)
        if prefix:  # an ens.model.save_pretrained directory
            _infer_options(meta, state, ensemble.model)
        state = {prefix + k: v for k, v in state.items()}
        _check_conversion(ensemble, meta, where, "the ensemble trained", " to resume from it")
        fix = (
            "train an ensemble of the architecture it was trained from (the same class and "
            "configuration); nothing was loaded"
        )
        _check_weights(ensemble, state, where, fix)
        ensemble.load_state_dict(state, strict=False)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """The optimizer ``args.optim`` names over :func:`snens.param_groups`; one passed as
        ``optimizers=(optimizer, scheduler)`` is kept."""
        if self.optimizer is None:
            opt_model = self.model if model is None else model
            groups = param_groups(
                opt_model, self.args.learning_rate, self.args.weight_decay, self.gamma_lr_multiplier
            )
            optimizer_cls, optimizer_kwargs = (
                self.optimizer_cls_and_kwargs
                or self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            )
            if {"params", "model", "optimizer_dict"} & set(optimizer_kwargs):
                raise ValueError(
                    f"optim={self.args.optim!r} builds its own parameter groups, which "
                    "would replace snens.param_groups (γ's group); use an optimizer that "
                    "takes parameter groups, such as optim='adamw_torch'"
                )
            # each group carries its own lr and weight_decay, which override these defaults
            self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    def prediction_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The ensemble's mean prediction on a batch, in eval mode.

        Returns:
            ``(loss, probs, labels)``: the NLL of the mean probabilities (B, K) (None without
            labels), those probabilities, and the labels.
        """
        features, labels = self._split_labels(self._prepare_inputs(inputs), required=False)
        with torch.no_grad(), self.compute_loss_context_manager():
            probs = predictive_probs(model(**features))  # (M, B, K) -> (B, K)
        loss = None if labels is None else torch.tensor(nll(probs, labels), device=probs.device)
        if prediction_loss_only:
            return loss, None, None
        return loss, probs, labels


def _unshared(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with a copy of each tensor whose memory an earlier one holds (for safetensors)."""
    seen: set[int] = set()
    out = {}
    for name, value in state.items():
        if isinstance(value, Tensor) and value.numel() and value.device.type != "meta":
            value = value.detach().contiguous()
            pointer = value.untyped_storage().data_ptr()
            if pointer in seen:
                value = value.clone()
            seen.add(pointer)
        out[name] = value
    return out


def _write_config(ensemble: Ensemble, directory: Path) -> None:
    report = ensemble.report
    write_meta(
        directory / SNENS_CONFIG,
        ensemble,
        FORMAT_VERSION,
        converted=report is not None,  # False: member layers at construction
        head=None if report is None else report.head,
        skip_unsupported=report is not None and bool(report.skipped),
        custom_output=ensemble.output is not None,
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(files.read_bytes(path, limit=_MAX_JSON_BYTES, follow_links=True))
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        raise ValueError(f"{path} is not valid JSON ({error}); save it again") from None


def _read_weights(directory: Path) -> dict[str, Tensor]:
    """The tensors of a Trainer save or a ``save_pretrained`` directory (sharded or not)."""
    if os.path.lexists(directory / _SAFETENSORS):
        return load_safetensors(directory / _SAFETENSORS)
    if os.path.lexists(directory / _SAFETENSORS_INDEX):
        path = directory / _SAFETENSORS_INDEX
        index = _read_json(path)
        shards = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(shards, dict) or not all(isinstance(s, str) for s in shards.values()):
            raise ValueError(
                f'{path} holds no "weight_map" of tensor names to shard files; save it again'
            )
        state: dict[str, Tensor] = {}
        # each shard by its plain name inside the save: "../x" or "/x" is refused, not read
        for shard in sorted(set(shards.values())):
            state.update(load_safetensors(files.inside(directory, shard)))
        return state
    if os.path.lexists(directory / _PICKLED):  # Trainer with save_safetensors=False (v4)
        path = directory / _PICKLED
        os.close(files.open_regular(path, follow_links=True))
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - a refused or damaged pickle
            raise ValueError(
                f"{path} could not be loaded as tensors ({error}); save it again"
            ) from None
        if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
        ):
            raise ValueError(
                f"{path} holds a {type(state).__name__}, not a state dict of tensor names to "
                "tensors; give the directory trainer.save_model(directory) wrote"
            )
        return state
    raise FileNotFoundError(
        f"{directory} holds no weights ({_SAFETENSORS}, {_SAFETENSORS_INDEX} or {_PICKLED}); "
        "give the directory trainer.save_model(directory) wrote"
    )


def _read_config(directory: Path, state: dict[str, Tensor]) -> tuple[dict[str, Any], str]:
    """``snens.json`` and the prefix of the saved names: "" for a Trainer save, "model." for
    ``ens.model.save_pretrained`` (M read from γ; ``norms`` and ``head`` from the tensors by
    :func:`_infer_options` once the model is built)."""
    path = directory / SNENS_CONFIG
    if path.is_file():
        flags = dict.fromkeys(("converted", "skip_unsupported", "custom_output"), bool)
        kinds = {"num_members": int, "input_policy": str, **flags}
        writer = {"writer": "SnensTrainer.save_model", "saved": "the ensemble"}
        return check_meta(_read_json(path), path, version=FORMAT_VERSION, kinds=kinds, **writer), ""
    if (directory / _TRAINING_ARGS).is_file():  # SnensTrainer's save, snens.json moved in last
        raise FileNotFoundError(
            f"{path} is missing beside {_TRAINING_ARGS}: a SnensTrainer save that did not "
            "complete (snens.json is written last); save again, or load an earlier checkpoint"
        )
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is missing: {directory} was not written by SnensTrainer.save_model (or "
            "the save was interrupted; save again)"
        )
    # ens.model.save_pretrained(directory): M from γ (M, C)
    members = {tuple(v.shape[:1]) for k, v in state.items() if k.endswith(".gamma") and v.dim()}
    if len(members) != 1:
        found = "no member norm γ" if not members else f"γ of {len(members)} sizes of M"
        raise ValueError(
            f"{directory} holds {found}, so it is not a σN-Ens model saved with "
            "ens.model.save_pretrained; load a plain model with from_pretrained, a "
            "SnensTrainer save with its snens.json"
        )
    (num_members,) = members.pop()
    meta = {
        "num_members": num_members,
        "input_policy": "repeat",
        "converted": True,
        "head": "auto",
        "norms": None,
        "skip_unsupported": False,
        "custom_output": False,
        "config": SnensConfig(num_members=num_members),
    }
    return meta, "model."


def _infer_options(meta: dict[str, Any], state: dict[str, Tensor], model: nn.Module) -> None:
    """Set the ``norms`` and ``head`` of an ``ens.model.save_pretrained`` save (``state``, of
    ``model``) in ``meta``: the norms saved with a γ, and the linear layer saved with a member
    dimension (None where the output layer was shared: ``head=None``)."""
    meta["norms"] = [k.removesuffix(".gamma") for k, v in state.items() if k.endswith(".gamma")]
    linears = [
        (name, type(m) is nn.Linear)
        for name, m in model.named_modules()
        if type(m) is nn.Linear or isinstance(m, MemberLinear)
    ]
    heads = [name for name, _ in linears if getattr(state.get(f"{name}.weight"), "ndim", 0) == 3]
    meta["head"] = heads[-1] if heads else None
    plain = [name for name, exact in linears if exact]
    auto = bool(plain) and meta["head"] == plain[-1]  # what head="auto" chooses
    meta["config"] = meta["config"].replace(head="auto" if auto else meta["head"])


def _converted_with(ensemble: Ensemble) -> tuple[list[str], dict[str, Any]] | None:
    """The names of the norms ``ensemble`` converted and the ``norms=`` (None: every norm) and
    ``head=`` that chose them; None for an ensemble not built by :func:`snens.convert`."""
    report = ensemble.report
    if report is None:
        return None
    names = [name for name, _, _ in report.converted]
    return names, {"norms": names if report.unselected else None, "head": report.head}


def _check_conversion(
    ensemble: Ensemble, meta: dict[str, Any], where: Path, what: str, then: str
) -> None:
    """Refuse ``ensemble`` (``what``) where its M, ``norms=`` or ``head=`` is not the save's
    (``meta``), naming the ``snens.convert`` call that fits it (``then``: what follows)."""
    num_members = meta["num_members"]
    if ensemble.num_members != num_members:
        raise ValueError(
            f"{what} has num_members={ensemble.num_members}, {where} holds "
            f"num_members={num_members}; build it with num_members={num_members}{then}"
        )
    given = _converted_with(ensemble)
    if given is None or not meta["converted"]:
        return  # member layers at construction: the weights' shapes alone are checked
    names, options = given
    saved = {"norms": meta.get("norms"), "head": meta.get("head")}
    if saved["norms"] is None:  # every norm
        same_norms = options["norms"] is None
    else:  # the names converted
        same_norms = set(names) == set(saved["norms"])
    same_head = "head" not in meta or options["head"] == saved["head"]
    differ = [key for key, same in (("norms", same_norms), ("head", same_head)) if not same]
    if differ:

        def shown(values: dict[str, Any]) -> str:
            return ", ".join(f"{key}={values[key]!r}" for key in differ)

        raise ValueError(
            f"{what} was converted with {shown(options)}, {where} holds an ensemble converted "
            f"with {shown(saved)}; build it with snens.convert(model, {num_members}, "
            f"{shown(saved)}){then}"
        )


def _fresh_ensemble(
    model: nn.Module, meta: dict[str, Any], output: Callable[[Any], Tensor] | None, where: Path
) -> Ensemble:
    num_members = meta["num_members"]
    if meta["custom_output"] and output is None:
        raise ValueError(
            f"{where} was saved from an ensemble built with output=, a function that is not "
            "saved; pass the same function: load_ensemble(model, directory, output=...)"
        )
    if isinstance(model, Ensemble):
        then = ", or pass the plain model: load_ensemble converts it as it was saved"
        _check_conversion(model, meta, where, "the ensemble given", then)
        model.snens_config = meta["config"]
        return model
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"load_ensemble takes the model the ensemble was trained from (an nn.Module, or a "
            f"function building one), got {type(model).__name__}"
        )
    if not meta["converted"]:
        raise TypeError(
            f"{where} was saved from an ensemble not built by snens.convert (member layers at "
            f"construction); build that model again with num_members={num_members}, wrap it "
            f"in snens.Ensemble(model, {num_members}) and pass the ensemble"
        )
    ensemble = convert(
        model,
        num_members,
        head=meta["head"],
        skip_unsupported=meta["skip_unsupported"],
        norms=only_named(meta.get("norms")),
        input_policy=meta["input_policy"],
        output=output,
        inplace=True,
    )
    ensemble.snens_config = meta["config"]  # τ, λ, γ's multiplier and init as trained
    return ensemble


def _check_weights(
    ensemble: Ensemble,
    state: dict[str, Tensor],
    where: Path,
    fix: str = "pass the architecture the ensemble was trained from (the same class and "
    "configuration), freshly built; the model given was left as it was",
) -> None:
    """Every tensor of ``state`` must fit ``ensemble``, and every tensor of it (a tied one under
    any of its names) be given; else a ValueError ending in ``fix``."""
    expected = ensemble.state_dict()
    same = {  # name -> the tensor object it names: tied names name one
        name: id(tensor)
        for name, tensor in (
            *ensemble.named_parameters(remove_duplicate=False),
            *ensemble.named_buffers(remove_duplicate=False),
        )
    }
    given = {same.get(k, k) for k in state if k in expected}
    check_weights(
        state,
        expected,
        [k for k in expected if k not in state and same.get(k, k) not in given],
        f"the weights in {where} do not fit the model given",
        fix,
    )


def _built_from_saved_config(cls: type, where: Path) -> nn.Module:
    if not (where / "config.json").is_file():
        raise FileNotFoundError(
            f"{where} holds no config.json to build {cls.__name__} from (a save of an ensemble "
            "over a model without a Hugging Face config); pass the model itself, freshly built"
        )
    config = transformers.AutoConfig.from_pretrained(str(where))
    takes = getattr(cls, "config_class", None)  # a model class's; an Auto class has none
    if isinstance(takes, type) and not isinstance(config, takes):
        raise ValueError(
            f"{where / 'config.json'} describes a {config.model_type!r} model "
            f"({type(config).__name__}), and {cls.__name__} is built from a {takes.__name__}; "
            f"pass the class of the saved model ({', '.join(config.architectures or [])}"
            f"{' or ' if config.architectures else ''}an Auto class, such as "
            "transformers.AutoModelForSequenceClassification)"
        )
    # an Auto class builds through from_config; a model class takes the config itself
    return cls.from_config(config) if hasattr(cls, "from_config") else cls(config)


def load_ensemble(
    model: nn.Module | Callable[[], nn.Module] | type,
    directory: str | os.PathLike,
    *,
    output: Callable[[Any], Tensor] | None = None,
) -> Ensemble:
    """The trained ensemble saved in ``directory`` (by ``SnensTrainer.save_model``, a checkpoint,
    or ``ens.model.save_pretrained``, whose ``norms=`` and ``head=`` are read from the saved
    tensors): ``model`` converted afresh, the weights loaded.

    ``model`` is the architecture it was trained from, freshly built, a function building it, or a
    Hugging Face model class built from the saved ``config.json``; it is converted in place once
    the save was found to fit it (an ensemble built without :func:`snens.convert` is passed as the
    :class:`snens.Ensemble`). ``output`` is the ``output=`` function it was built with, if any.

    Returns:
        The :class:`snens.Ensemble`, in eval mode, computing what the saved one did.

    Raises:
        FileNotFoundError: no weights; neither ``snens.json`` nor ``config.json``; a
            ``SnensTrainer`` save without its ``snens.json`` (interrupted).
        ValueError: a PEFT save; a damaged or other-version ``snens.json``, weight file or shard
            index; a shard outside the directory; weights that do not fit the model; a model class
            another ``config.json`` describes; an ensemble of another M, ``norms=`` or ``head=``
            (the ``snens.convert`` call that fits named); a saved ``output=`` not passed again.
        TypeError: ``model`` is not a module; a save of an ensemble not built by convert, given a
            plain model.
        snens.files.FileRefusedError: a weight file that is a FIFO, device or directory.
    """
    where = Path(directory)
    if not where.is_dir():
        raise FileNotFoundError(
            f"{where} is not a directory; give the directory trainer.save_model(directory) wrote"
        )
    if (where / "adapter_config.json").is_file():
        raise ValueError(
            f"{where} holds a PEFT save (adapter_config.json); load it with "
            "snens.integrations.peft.from_pretrained(base_model, directory)"
        )
    state = _read_weights(where)
    meta, prefix = _read_config(where, state)
    if isinstance(model, type) and (
        hasattr(model, "from_config") or issubclass(model, transformers.PreTrainedModel)
    ):
        model = _built_from_saved_config(model, where)
    elif not isinstance(model, nn.Module) and callable(model):
        model = model()
    if prefix and isinstance(model, nn.Module):  # save_pretrained: norms= and head= inferred
        _infer_options(meta, state, model.model if isinstance(model, Ensemble) else model)
    state = {prefix + k: v for k, v in state.items()}
    # checked on a copy without values first: the model given is converted only if the save fits
    skeleton = meta_copy(model) if isinstance(model, nn.Module) else None
    if skeleton is not None and not isinstance(model, Ensemble):
        _check_weights(_fresh_ensemble(skeleton, meta, output, where), state, where)
    ensemble = _fresh_ensemble(model, meta, output, where)
    _check_weights(ensemble, state, where)
    ensemble.load_state_dict(state, strict=False)
    if prefix and ensemble.report is not None and ensemble.report.unselected:
        ensemble.snens_config = ensemble.snens_config.replace(norms=tuple(meta["norms"]))
    return ensemble.eval()
