"""Run configs: TOML round trip, unknown keys and bad values refused by name, overrides, presets."""

import pytest
import tomllib

from snens.engine.config import (
    MAX_THREADS,
    DataConfig,
    MethodConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    load_config,
    to_dict,
    to_toml,
)
from snens.engine.presets import PRESETS, preset


def _custom() -> RunConfig:
    return RunConfig(
        seed=7,
        name='odd "name" \\ with ünïcode',
        deterministic=True,
        data=DataConfig(dataset="cifar10", ood=("svhn",), severities=(1, 5), augment=("flip",)),
        model=ModelConfig(backbone="resnet18", options={"width": 8, "tag": "a\tb", "f": 1e-7}),
        method=MethodConfig(temperature=0.05, options={"head_init": "reset"}),
        optim=OptimConfig(
            optimizer="sgd", schedule="multistep", milestones=(2, 5), epochs=6, lr=0.1
        ),
    )


@pytest.mark.parametrize("config", [RunConfig(), _custom()], ids=["defaults", "custom"])
def test_toml_round_trip(config, tmp_path):
    text = to_toml(config)
    assert load_config(tomllib.loads(text)) == config
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    loaded = load_config(path)
    assert loaded == config
    assert to_toml(loaded) == text
    assert to_dict(loaded) == to_dict(config)


def test_unknown_keys_are_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"'optim\.learning_rate'.*valid keys in \[optim\]: .*lr"):
        load_config({"optim": {"learning_rate": 0.1}})
    with pytest.raises(
        ValueError, match=r"unknown config key 'sed' \(did you mean 'seed'\?\); valid keys: seed"
    ):
        load_config({"sed": 1})
    with pytest.raises(ValueError, match=r"'data\.batchsize'"):
        load_config(None, ["data.batchsize=3"])
    with pytest.raises(ValueError, match=r"'nothing'"):
        load_config(None, ["nothing.lr=3"])


@pytest.mark.parametrize(
    ("values", "error", "pattern"),
    [
        ({"optim": {"lr": "fast"}}, TypeError, r"optim\.lr must be a number, got str 'fast'"),
        ({"optim": {"epochs": 2.5}}, TypeError, r"optim\.epochs must be an int"),
        ({"deterministic": "yes"}, TypeError, r"deterministic must be a bool"),
        ({"data": {"augment": "crop"}}, TypeError, r"data\.augment must be a list"),
        ({"model": {"options": 3}}, TypeError, r"model\.options must be a table"),
        ({"data": 5}, TypeError, r"\[data\] must be a table"),
        ({"optim": {"lr": -1.0}}, ValueError, r"optim\.lr must be finite, >= 0"),
        ({"optim": {"optimizer": "adam"}}, ValueError, r"optim\.optimizer must be one of"),
        ({"method": {"name": "magic"}}, ValueError, r"method\.name must be one of 'single'"),
        ({"method": {"temperature": 0}}, ValueError, r"method\.temperature"),
        ({"method": {"name": "single"}}, ValueError, r"num_members must be 1"),
        ({"data": {"severities": [0]}}, ValueError, r"data\.severities"),
        ({"data": {"ood": ["imagenet_o"]}}, ValueError, r"data\.ood"),
        ({"optim": {"schedule": "multistep"}}, ValueError, r"optim\.milestones is empty"),
        ({"optim": {"milestones": [5, 3]}}, ValueError, r"optim\.milestones must be increasing"),
        (
            {"data": {"batch_size": 0}},
            ValueError,
            r"data\.batch_size must be an int in 1\.\.2\*\*20",
        ),
        ({"name": "../x"}, ValueError, r"name must be a directory name"),
        ({"seed": 2**32}, ValueError, r"seed must be an int in \[0, 2\*\*32\)"),
        ({"optim": {"lr": 10**400}}, ValueError, r"optim\.lr is too large for a float"),
        ({"model": {"options": {"w": None}}}, TypeError, r"model\.options\.w must be a string"),
    ],
)
def test_bad_values_name_the_key(values, error, pattern):
    with pytest.raises(error, match=pattern):
        load_config(values)


def test_split_inputs_need_a_batch_divisible_by_members():
    with pytest.raises(ValueError, match="not divisible by method.num_members 4"):
        load_config({"data": {"batch_size": 30}, "method": {"input_policy": "split"}})


def test_overrides_are_parsed_as_toml_values():
    config = load_config(
        preset("fashion_mnist_small_cnn"),
        [
            "method.temperature=0.5",
            "optim.epochs=3",
            "optim.milestones=[1, 2]",
            "optim.schedule=multistep",  # a bare word is a string
            "model.options.width=8",
            "data.ood=[]",
            "deterministic=true",
            'name="run 1"',
        ],
    )
    assert config.method.temperature == 0.5
    assert isinstance(config.method.temperature, float)
    assert config.optim.epochs == 3 and config.optim.milestones == (1, 2)
    assert config.optim.schedule == "multistep"
    assert config.model.options == {"width": 8}
    assert config.data.ood == () and config.deterministic and config.name == "run 1"
    with pytest.raises(ValueError, match="key=value"):
        load_config(None, ["method.temperature"])
    with pytest.raises(TypeError, match=r"method\.temperature must be a number"):
        load_config(None, ["method.temperature=warm"])


def test_configs_are_frozen():
    config = RunConfig()
    with pytest.raises(AttributeError):
        config.seed = 3  # type: ignore[misc]


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_loads_and_round_trips(name):
    config = preset(name)
    assert isinstance(config, RunConfig)
    assert load_config(tomllib.loads(to_toml(config))) == config
    assert preset(name) is not preset(name)  # a fresh copy each time


def test_paper_presets_hold_the_recipes():
    r18 = preset("cifar10_resnet18")
    assert (r18.data.dataset, r18.model.backbone, r18.data.batch_size) == (
        "cifar10",
        "resnet18",
        128,
    )
    assert (r18.optim.optimizer, r18.optim.lr, r18.optim.momentum) == ("sgd", 0.05, 0.9)
    assert (r18.optim.weight_decay, r18.optim.epochs) == (5e-4, 75)
    assert (r18.optim.schedule, r18.optim.milestones) == ("multistep", (25, 50))
    assert r18.data.augment == ("crop", "flip")
    assert preset("cifar100_wrn28_10").model.backbone == "wrn28_10"
    assert preset("sst2_minilm").model.backbone == "minilm"


def test_unknown_preset_lists_the_names():
    with pytest.raises(ValueError, match="cifar10_resnet18"):
        preset("cifar11")


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_printed_preset_is_a_config_file_of_the_preset(name, tmp_path, capsys):
    """The presets have one source, snens.engine.presets; `snens train --preset NAME --print-config`
    writes the TOML file a user edits, which loads to exactly the preset."""
    from snens.engine.cli import main

    assert main(["train", "--preset", name, "--print-config"]) == 0
    path = tmp_path / f"{name}.toml"
    path.write_text(capsys.readouterr().out)
    assert load_config(path) == preset(name)


def test_config_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[optim\nlr = 1")
    with pytest.raises(ValueError, match="bad.toml: not valid TOML"):
        load_config(path)
    with pytest.raises(FileNotFoundError, match="missing.toml"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    "override", ['data.root="/data', 'name="\\ud800"', "optim.milestones=[1, 2", "data.root={a"]
)
def test_a_broken_quoted_or_bracketed_override_is_an_error_not_a_string(override):
    key = override.split("=")[0]
    with pytest.raises(ValueError, match=f"override '{key}'.*not a valid TOML value"):
        load_config(None, [override])


def test_a_bare_override_string_is_taken_as_written():
    assert load_config(None, ["data.root=/data/sets"]).data.root == "/data/sets"


def test_typos_get_a_did_you_mean():
    from snens.engine.presets import preset

    with pytest.raises(ValueError, match=r"unknown preset 'fashion_mnist_smal_cnn' \(did you mean "
                       r"'fashion_mnist_small_cnn'\?\)"):  # fmt: skip
        preset("fashion_mnist_smal_cnn")
    with pytest.raises(ValueError, match=r"'optim.epoch' \(did you mean 'epochs'\?\)"):
        load_config(preset("fashion_mnist_small_cnn"), ["optim.epoch=3"])
    with pytest.raises(ValueError) as nothing_close:
        load_config(preset("fashion_mnist_small_cnn"), ["optim.zzz=3"])
    assert "did you mean" not in str(nothing_close.value)


def test_a_shorter_multistep_run_is_told_which_milestones_fit():
    from snens.engine.presets import preset

    with pytest.raises(ValueError) as error:
        load_config(preset("cifar10_resnet18"), ["optim.epochs=30"])
    message = str(error.value)
    assert "got (25, 50)" in message and "optim.milestones=[10, 20]" in message
    assert 'optim.schedule="cosine" with optim.milestones=[]' in message
    # the suggestion itself is a valid config
    fixed = load_config(
        preset("cifar10_resnet18"), ["optim.epochs=30", "optim.milestones=[10, 20]"]
    )
    assert fixed.optim.milestones == (10, 20)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.ood=['mnist_5k', 'mnist_5k']"], "data.ood lists 'mnist_5k' twice; list each once"),
        (["data.augment=['flip', 'crop', 'flip']"], "data.augment lists 'flip' twice"),
        (["data.severities=[5, 1, 5]"], "data.severities lists 5 twice"),
        (
            ["data.corruptions=true", "data.severities=[]"],
            "data.corruptions is true but data.severities is empty, so no corrupted set would "
            "be evaluated",
        ),
    ],
)
def test_lists_that_would_silently_do_less_are_refused(overrides, message):
    """An empty severity list had evaluated no corrupted set at all, without a word; a set
    listed twice was evaluated once."""
    with pytest.raises(ValueError) as err:
        load_config(preset("fashion_mnist_small_cnn_tiny"), overrides)
    assert message in str(err.value)


def test_threads_are_bounded_before_libgomp_sees_them():
    """``--set threads=100000`` passed the config and segfaulted in libgomp (exit status 139),
    leaving a run directory with only run.lock in it."""
    with pytest.raises(ValueError) as err:
        load_config(None, ["threads=100000"])
    assert str(err.value) == (
        f"threads must be an int in [0, {MAX_THREADS}] (0 = torch's default; threads beyond the "
        "CPU cores do not help), got 100000"
    )
    assert MAX_THREADS == 1024
    assert load_config(None, [f"threads={MAX_THREADS}"]).threads == 1024
    with pytest.raises(ValueError, match=r"threads must be an int in \[0, 1024\].*got -1"):
        load_config(None, ["threads=-1"])


@pytest.mark.parametrize(
    ("name", "shown", "code", "at"),
    [
        ("run\n2", r"'\n'", "000A", 3),
        ("\rrun", r"'\r'", "000D", 0),
        ("a\tb", r"'\t'", "0009", 1),
        ("bell\x07", r"'\x07'", "0007", 4),
        ("del\x7f", r"'\x7f'", "007F", 3),
        ("line\u2028sep", r"'\u2028'", "2028", 4),
    ],
)
def test_a_run_name_with_a_control_character_is_refused_naming_it(name, shown, code, at):
    """A newline in a run name was accepted and written into the directory name, breaking
    every line-based record that names the run."""
    with pytest.raises(ValueError) as err:
        load_config({"name": name})
    assert str(err.value) == (
        f"name holds the control character {shown} (U+{code}) at position {at} of {name!r}; a "
        "run directory name must be printable: remove it"
    )
    assert load_config({"name": "run 2 – ünïcode"}).name == "run 2 – ünïcode"


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "data.num_workers=100000",
            "data.num_workers must be an int in 0..512, or -1 (min(8, CPUs)), got 100000",
        ),
        ("data.num_workers=-2", "data.num_workers must be an int in 0..512, or -1"),
        ("data.batch_size=2097152", "data.batch_size must be an int in 1..2**20, got 2097152"),
        ("data.eval_batch_size=0", "data.eval_batch_size must be an int in 1..2**20, got 0"),
        (
            "data.train_examples=1099511627777",
            "data.train_examples must be an int in 0..2**40 (0 = all), got 1099511627777",
        ),
        ("data.image_size=100000", "data.image_size must be an int in 1..4096, got 100000"),
        (
            "data.resize=100000",
            "data.resize must be an int in 0..4096 (0 = as stored), got 100000",
        ),
        (
            "data.resize_size=5000",
            "data.resize_size must be an int in data.image_size (224)..4096, got 5000",
        ),
        ("data.max_length=1000000", "data.max_length must be an int in 2..65536, got 1000000"),
        (
            "data.corruption_seed=4294967296",
            "data.corruption_seed must be an int in [0, 2**32), got 4294967296",
        ),
        (
            "model.num_classes=10000000",
            "model.num_classes must be an int in 0..2**20 (0 = the data set's), got 10000000",
        ),
        ("optim.epochs=1000001", "optim.epochs must be an int in 1..10**6, got 1000001"),
        ("checkpoint_every=1000001", "checkpoint_every must be an int in 1..10**6, got 1000001"),
        ("eval_every=-1", "eval_every must be an int in 0..10**6, got -1"),
        # 1e-300 had asked for 10**300 - 1 validation examples, a number of 300 digits
        ("data.conformal_alpha=1e-300", "data.conformal_alpha must be a number in [1e-06, 1)"),
        # 1e300 had overflowed float32 inside torch.optim, a trace at the first step
        ("optim.lr=1e300", "optim.lr must be a number in [0, 1000], got 1e+300"),
        ("optim.weight_decay=1e5", "optim.weight_decay must be a number in [0, 1000], got"),
        (
            "method.gamma_lr_multiplier=1e300",
            "method.gamma_lr_multiplier must be a number in [0, 10000], got 1e+300",
        ),
    ],
)
def test_every_numeric_key_is_bounded_naming_the_key_the_value_and_the_range(override, message):
    """data.num_workers had no upper bound: 100000 was accepted, and an image-folder run started
    that many worker processes; the other counts and sizes had none either."""
    with pytest.raises(ValueError) as err:
        load_config(None, [override])
    assert str(err.value).startswith(message)


def test_a_folder_loader_refuses_a_number_of_workers_out_of_range():
    from snens.data import FolderLoader

    examples = [(0.0, 0)] * 4
    for workers in (100000, -2, 1.5, True):
        with pytest.raises(ValueError, match=r"num_workers must be an int in 0\.\.512, or -1"):
            FolderLoader(examples, 2, num_workers=workers)
    assert FolderLoader(examples, 2, num_workers=512).num_workers == 512


@pytest.mark.parametrize(
    "options, message",
    [
        (
            "{bogus=1}",
            "method.options.bogus is not an option of method 'snens'; its options are: head, "
            "head_init, skip_unsupported, gamma_mean, gamma_std, norms",
        ),
        ("{head_ini='reset'}", "(did you mean 'head_init'?)"),
        ("{inplace=true}", "method.options.inplace is not an option of method 'snens'"),
        (
            "{num_members=3}",
            "method.options.num_members is the config key method.num_members: set it there",
        ),
        (
            "{input_policy='own'}",
            "method.options.input_policy is the config key method.input_policy: set it there",
        ),
        ("{generator=1}", "method.options.generator takes a Python object"),
        # 5 had been a TypeError from inside convert, once the data were loaded
        ("{norms=5}", "method.options.norms must be a regular expression or a list of module"),
        ("{norms=[]}", "method.options.norms must be a regular expression or a list of module"),
    ],
)
def test_method_options_are_options_of_the_method_and_nowhere_else(options, message):
    """An unknown key had been a TypeError from inside convert, at build time; num_members a
    TypeError from create; input_policy had replaced method.input_policy without a word."""
    with pytest.raises(ValueError) as err:
        load_config(None, [f"method.options={options}"])
    assert message in str(err.value)


def test_the_options_of_every_method_are_accepted():
    from snens.baselines import create

    for method, options in (
        ("batch_ensemble", "{init_std=0.3}"),
        ("film", "{spread=0.2}"),
        ("mc_dropout", "{p=0.2}"),
        ("deep_ensemble", "{vectorize=true}"),
        ("snens", "{head_init='reset', gamma_std=0.5}"),
    ):
        members = "method.num_members=1" if method == "single" else "method.num_members=2"
        config = load_config(
            None, [f"method.name='{method}'", members, f"method.options={options}"]
        )
        assert config.method.options
    with pytest.raises(ValueError, match="method 'film' takes no option 'p'; its options are: "):
        create("film", "small_cnn", num_classes=3, num_members=2, p=0.5)
