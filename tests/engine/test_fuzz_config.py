"""Property tests of the config loader with random input: dicts, overrides and TOML files.

The property, for every input: ``load_config`` (``from_dict``, ``apply_overrides``) either
returns a :class:`RunConfig` that survives ``to_toml`` → ``load_config`` unchanged (also through
a file), or raises ``ValueError``/``TypeError`` whose message names a key of the input (or,
for an unreadable file, the file). Inputs mix known and unknown keys with values of every
type: ints (huge ones too), floats (NaN, ±inf), strings (lone surrogates too), booleans
where ints are expected, NumPy scalars, lists, nested tables, None.

Bugs the properties found in the loader as it was (fixed in snens.engine.config): an override below
a key that holds a scalar or None (``data=5`` then ``data.batch_size=1``) raised a bare
``AttributeError``/``TypeError`` naming no key; a config file that is not UTF-8 raised
``UnicodeDecodeError`` without the file's name. Found by reading it and pinned in
:func:`test_known_bugs_stay_fixed`: an override value with a line break set the key from the
first line and dropped the rest; options holding tuples or NumPy floats did not read back as
written (``np.float64(0.5)`` is not TOML), and the frozen config shared the caller's option
dicts; a lone surrogate made ``config.toml`` unwritable; ``device = "cuda:x"`` was accepted.
"""

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snens.engine.config import (
    _SECTIONS,
    RunConfig,
    apply_overrides,
    from_dict,
    load_config,
    to_dict,
    to_toml,
)
from snens.engine.presets import preset

TRIED = {"dicts": 0, "overrides": 0, "files": 0}
SETTINGS = settings(
    max_examples=300,
    deadline=None,
    database=None,
    derandomize=True,  # the same inputs on every run: a failure here is reproducible
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
KNOWN = {name: list(to_dict(RunConfig())[name]) for name in _SECTIONS}
TOP = [k for k in to_dict(RunConfig()) if k not in _SECTIONS]

# -- values ---------------------------------------------------------------------------------------

scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-3, max_value=300),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2**32, 2**63, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.5, 1e-3, 0.9, 1.0, math.nan, math.inf, -math.inf]),
    st.text(max_size=8),
    st.sampled_from(
        [
            "snens",
            "sst2",
            "rotten_tomatoes",
            "imagenet",
            "cifar10",
            "crop",
            "flip",
            "rt_plots",
            "svhn",
            "split",
            "sgd",
            "multistep",
            "auto",
            "cpu",
            "cuda:1",
            "cuda:x",
            "a/b",
            "\ud800",
            "longest",
            "max_length",
            "norms_and_heads",
            "single",
            "",
            "x\ny",
        ]
    ),
    st.builds(np.float64, st.floats(allow_nan=False, width=32)),
    st.none(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=5), inner, max_size=3),
    ),
    max_leaves=6,
)


def _section(name):
    keys = st.one_of(st.sampled_from(KNOWN[name]), st.text(max_size=6))
    return st.dictionaries(keys, values, max_size=4)


top_level = st.dictionaries(
    st.one_of(st.sampled_from(TOP), st.text(max_size=6)), values, max_size=3
)
configs = st.builds(
    lambda top, sections: {**top, **sections},
    top_level,
    st.fixed_dictionaries(
        {},
        optional={name: st.one_of(_section(name), values) for name in _SECTIONS},
    ),
)

# -- the oracle -----------------------------------------------------------------------------------


def _names(values, prefix=""):
    """Every key of nested dicts, alone and as a dotted path, and as a TOML section."""
    out = set()
    if isinstance(values, dict):
        for key, value in values.items():
            path = f"{prefix}{key}"
            out |= {str(key), path, f"[{path}]"}
            out |= _names(value, f"{path}.")
    return out


def _same_toml(config: RunConfig) -> None:
    text = to_toml(config)
    again = load_config(tomllib.loads(text))
    assert to_toml(again) == text  # NaN in options: equal as text, not as floats
    if "nan" not in text:
        assert again == config
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "run.toml"
        path.write_text(text, encoding="utf-8")
        assert to_toml(load_config(path)) == text


def _check(call, names) -> None:
    try:
        config = call()
    except (ValueError, TypeError) as error:
        message = str(error)
        named = any((name and name in message) or repr(name) in message for name in names)
        assert named, f"{type(error).__name__} names none of the input's keys: {message}"
        return
    assert isinstance(config, RunConfig)
    _same_toml(config)


# -- the properties -------------------------------------------------------------------------------


@SETTINGS
@given(configs)
def test_random_tables(values):
    TRIED["dicts"] += 1
    names = _names(values)
    _check(lambda: load_config(values), names)
    _check(lambda: from_dict(values), names)


def _override_key():
    known = [f"{section}.{key}" for section, keys in KNOWN.items() for key in keys] + TOP
    options = st.text(max_size=5).map(lambda k: f"model.options.{k}")
    return st.one_of(st.sampled_from(known), options, st.text(max_size=12))


def _override_text():
    literal = values.map(_toml_literal).filter(lambda t: t is not None)
    return st.one_of(literal, st.text(max_size=12))


def _toml_literal(value):
    from snens.engine.toml_io import format_value as _toml_value

    try:
        return _toml_value(value)
    except TypeError:  # None has no TOML form
        return None


overrides = st.lists(
    st.one_of(
        st.builds(lambda k, v: f"{k}={v}", _override_key(), _override_text()),
        st.text(max_size=15),
    ),
    max_size=4,
)
bases = st.one_of(
    st.sampled_from(
        ["rotten_tomatoes_minilm", "fashion_mnist_small_cnn_tiny", "imagenet_resnet50"]
    ).map(lambda name: to_dict(preset(name))),
    configs,
)


@SETTINGS
@given(bases, overrides)
def test_random_overrides(base, items):
    TRIED["overrides"] += 1
    names = _names(base)
    for item in items:
        key = item.split("=", 1)[0]
        names |= {item, key.strip(), *key.strip().split(".")}
    _check(lambda: load_config(base, items), names)
    _check(lambda: from_dict(apply_overrides(base, items)), names)


def _toml_file(values):
    lines = []
    for key, value in values.items():
        literal = _toml_literal(value)
        if literal is None:
            return None
        from snens.engine.toml_io import format_key as _toml_key

        lines.append(f"{_toml_key(str(key))} = {literal}")
    return "\n".join(lines) + "\n"


@SETTINGS
@given(
    st.one_of(
        configs.map(_toml_file)
        .filter(lambda t: t is not None)
        .map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=40),
        st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )
)
def test_random_toml_files(content):
    TRIED["files"] += 1
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.toml"
        path.write_bytes(content)
        try:
            values = tomllib.loads(content.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError):
            with pytest.raises(ValueError, match=r"fuzz\.toml: not valid TOML"):
                load_config(path)
            return
        _check(lambda: load_config(path), _names(values))


def test_known_bugs_stay_fixed(tmp_path):
    with pytest.raises(ValueError, match=r"'optim\.lr': the value must be one line"):
        load_config(None, ["optim.lr=0.1\nseed = 3"])
    with pytest.raises(TypeError, match=r"cannot set 'data\.batch_size': data must be a table"):
        load_config({"data": 5}, ["data.batch_size=1"])
    config = load_config({"model": {"options": {"t": (1, 2), "f": np.float64(0.25)}}})
    assert config.model.options == {"t": [1, 2], "f": 0.25}
    assert type(config.model.options["f"]) is float
    _same_toml(config)
    with pytest.raises(ValueError, match=r"name holds a character UTF-8 cannot encode"):
        load_config({"name": "run\ud800"})
    with pytest.raises(ValueError, match=r"model\.options\.w holds a character UTF-8"):
        load_config({"model": {"options": {"w": "\udcff"}}})
    path = tmp_path / "latin1.toml"
    path.write_bytes('name = "caf\xe9"'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.toml: not valid TOML: not UTF-8"):
        load_config(path)
    with pytest.raises(ValueError, match=r"device must be"):
        load_config({"device": "cuda:x"})
    options = {"w": [1]}
    config = load_config({"model": {"options": options}})
    options["w"].append(2)  # the frozen config holds its own copy
    assert config.model.options == {"w": [1]}


@pytest.mark.parametrize("kind", ["dicts", "overrides", "files"])
def test_each_property_tries_hundreds_of_inputs(kind):
    """A property that stopped drawing (a filter that rejects nearly everything, a strategy
    that collapsed to a few values) would pass without testing: run it here and count."""
    prop = {
        "dicts": test_random_tables,
        "overrides": test_random_overrides,
        "files": test_random_toml_files,
    }[kind]
    before = TRIED[kind]
    prop()
    assert TRIED[kind] - before >= 250, f"{kind}: {TRIED[kind] - before} inputs tried"
