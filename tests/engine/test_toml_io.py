"""TOML I/O: the text written for each value type, round trips, every preset, error messages."""

import errno
import math
import os

import pytest

from snens.engine.config import from_dict, load_config, to_toml
from snens.engine.presets import PRESETS, preset
from snens.engine.runs import MAX_FILE_BYTES
from snens.engine.toml_io import (
    MAX_TOML_BYTES,
    TOMLDecodeError,
    check_value,
    format_key,
    format_toml,
    format_value,
    parse_toml,
    parse_value,
    read_toml,
)

CONFIG_COMMENT = "snens run config (every key; see snens.engine.config for units)"


@pytest.mark.parametrize(
    "value, text",
    [
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-3, "-3"),
        (2**70, "1180591620717411303424"),
        (3.0, "3.0"),  # a float stays a float: "3" would read back as an int
        (0.1, "0.1"),
        (1e-4, "0.0001"),
        (1e-7, "1e-07"),
        (1e16, "1e+16"),
        (1e300, "1e+300"),
        (-0.0, "-0.0"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
        (math.nan, "nan"),
        ("", '""'),
        ('say "hi"', '"say \\"hi\\""'),
        ("C:\\data\\set", '"C:\\\\data\\\\set"'),
        ("line\nnext\r\tend", '"line\\nnext\\r\\tend"'),
        ("\x00\x1f\x7f", '"\\u0000\\u001f\\u007f"'),
        ("ünïcödé ключ ✓", '"ünïcödé ключ ✓"'),  # non-ASCII is written as it is (UTF-8)
        ([], "[]"),
        ([1, [2, []], "x"], '[1, [2, []], "x"]'),
        ((1.5, "x"), '[1.5, "x"]'),
        ({}, "{}"),
        ({"a b": {"c": True}, "d": [1]}, '{"a b" = {c = true}, d = [1]}'),
    ],
)
def test_format_value_writes_each_type(value, text):
    assert format_value(value) == text


@pytest.mark.parametrize(
    "key, text",
    [
        ("width", "width"),
        ("head-init_2", "head-init_2"),
        ("a b", '"a b"'),
        ("", '""'),
        ("ключ", '"ключ"'),
        ('q"', '"q\\""'),
        ("a.b", '"a.b"'),
    ],
)
def test_format_key_quotes_only_what_is_not_bare(key, text):
    assert format_key(key) == text


def test_format_value_refuses_what_toml_cannot_hold():
    with pytest.raises(TypeError, match=r"cannot write NoneType None to TOML"):
        format_value([1, None])
    with pytest.raises(TypeError, match=r"cannot write object"):
        format_value({"a": object()})


EVERY_TYPE = {
    "quoted": "say \"hi\" and 'bye'",
    "backslashes": "C:\\data\\set\\",
    "newlines": "line\nnext\r\nlast\n",
    "controls": "tab\there\x00\x1f\x7f",
    "non_ascii": "ünïcödé ключ 数据 ✓ 🙂",
    "empty_string": "",
    "int": 42,
    "negative": -7,
    "huge_int": 2**70,
    "zero_float": 0.0,
    "small": 1e-4,
    "tiny": 1.5e-300,
    "large": 1e300,
    "big_exact": 123456789.0,
    "true": True,
    "false": False,
    "empty_list": [],
    "nested_lists": [[1, 2], [], [["a"], [True, 0.5]]],
    "mixed_list": [1, "two", 3.0, False],
    "tuple": (0.9, 0.999),
    "inline_table": {"x": 1},
    "table": {
        "scalar": "s",
        "list": [1],
        "sub": {"key": "v", "deeper": {"a b": [1, {"c": []}]}, "empty": {}},
        "empty": {},
    },
}


def _lists(value):
    """``value`` as TOML reads it back: tuples become lists."""
    if isinstance(value, tuple | list):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


def test_round_trip_of_every_value_type(tmp_path):
    text = format_toml(EVERY_TYPE, "every type")
    assert parse_toml(text) == _lists(EVERY_TYPE)
    path = tmp_path / "every.toml"
    path.write_bytes(text.encode("utf-8"))  # no newline translation on any platform
    back = read_toml(path)
    # a "\r\n" inside a string is escaped, so reading with universal newlines keeps it
    assert back == _lists(EVERY_TYPE)
    assert type(back["big_exact"]) is float and type(back["int"]) is int
    assert format_toml(back, "every type") == text


def test_round_trip_of_non_finite_floats():
    back = parse_toml(format_toml({"inf": math.inf, "ninf": -math.inf, "nan": math.nan}))
    assert back["inf"] == math.inf and back["ninf"] == -math.inf and math.isnan(back["nan"])


def test_format_toml_layout():
    """Scalars first (whatever the order given), then tables as headers two levels deep, and
    tables further down inline."""
    values = {
        "table": {"x": 1, "inner": {"deep": {"y": 2}, "z": "w"}, "after": True},
        "seed": 0,
        "empty": {},
    }
    assert format_toml(values, "a comment") == (
        "# a comment\n"
        "seed = 0\n"
        "\n"
        "[table]\n"
        "x = 1\n"
        "after = true\n"
        "\n"
        "[table.inner]\n"
        "deep = {y = 2}\n"
        'z = "w"\n'
        "\n"
        "[empty]\n"
    )
    assert format_toml({"a": 1}) == "a = 1\n"
    assert format_toml({"a b": {"c.d": {}}}) == '\n["a b"]\n\n["a b"."c.d"]\n'
    assert parse_toml(format_toml({"a b": {"c.d": {}}})) == {"a b": {"c.d": {}}}


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_reads_back_equal(name, tmp_path):
    config = preset(name)
    text = to_toml(config)
    assert from_dict(parse_toml(text)) == config
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    assert from_dict(read_toml(path)) == config
    # the writer reproduces its own output from what the reader gives
    assert format_toml(parse_toml(text), CONFIG_COMMENT) == text


@pytest.mark.parametrize(
    "text, where",
    [
        ("[optim\nlr = 1", "at line 1, column 7"),
        ("seed = 1\nseed = 2\n", "at line 2, column 9"),
        ('a = 1\n\n[b]\nc = "x\ny"\n', "at line 4, column 7"),
        ("a = 1\nb = ]\n", "at line 2, column 5"),
        ('name = "abc', "at end of document"),
    ],
)
def test_bad_toml_names_the_file_and_the_line(text, where, tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as error:
        read_toml(path)
    message = str(error.value)
    assert message.startswith(f"{path}: not valid TOML: ")
    assert f"({where})" in message
    assert isinstance(error.value.__cause__, TOMLDecodeError)
    with pytest.raises(ValueError, match=rf"^settings: not valid TOML: .*\({where}\)$"):
        parse_toml(text, "settings")


def test_unreadable_files_are_named(tmp_path):
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("name = 'é'".encode("latin-1"))
    with pytest.raises(
        ValueError, match=r"latin1\.toml: not valid TOML: not UTF-8 \(.* at byte 8\)"
    ):
        read_toml(latin1)
    with pytest.raises(FileNotFoundError, match=r"config file .*missing\.toml not found"):
        read_toml(tmp_path / "missing.toml")
    with pytest.raises(OSError, match=f"^{tmp_path} is a directory, not a regular file, so it"):
        read_toml(tmp_path)  # a directory: named as what it is, not "not found"


def test_a_toml_file_above_the_limit_is_refused_before_a_byte_is_read(tmp_path):
    """read_toml read a config file whole: a 2 GiB (sparse) one cost 4.4 GB of memory before
    it failed as "not valid TOML". Its size is checked first, as every run file's."""
    assert MAX_TOML_BYTES == MAX_FILE_BYTES  # the limit of a run file, config.toml among them
    path = tmp_path / "big.toml"
    path.write_bytes(b"seed = 1\n")
    os.truncate(path, MAX_TOML_BYTES + 1)  # sparse: no disk used
    with pytest.raises(OSError) as error:
        read_toml(path)
    assert error.value.errno == errno.EFBIG
    assert str(error.value) == (
        f"{path} holds 67,108,865 bytes, above the limit of 67,108,864 for a TOML file (a config "
        "is a few kilobytes), so it was not read: move it away, or restore the file that belongs "
        "there"
    )
    with pytest.raises(OSError, match="holds 67,108,865 bytes, above the limit"):
        load_config(path)
    os.truncate(path, 9)
    assert read_toml(path) == {"seed": 1}
    with pytest.raises(OSError, match=r"holds 9 bytes, above the limit of 8 for a TOML file"):
        read_toml(path, limit=8)


@pytest.mark.timeout(20)
def test_a_fifo_is_named_never_waited_for(tmp_path):
    os.mkfifo(tmp_path / "pipe.toml")
    with pytest.raises(OSError, match=f"^{tmp_path / 'pipe.toml'} is a FIFO, not a regular file"):
        read_toml(tmp_path / "pipe.toml")


def test_a_config_given_by_hand_is_read_through_a_link_a_run_file_is_not(tmp_path):
    (tmp_path / "real.toml").write_text("seed = 4\n", encoding="utf-8")
    (tmp_path / "link.toml").symlink_to(tmp_path / "real.toml")
    assert read_toml(tmp_path / "link.toml") == {"seed": 4}
    assert load_config(tmp_path / "link.toml").seed == 4
    with pytest.raises(OSError, match=f"^{tmp_path / 'link.toml'} is a symbolic link, not a"):
        read_toml(tmp_path / "link.toml", follow_links=False)
    (tmp_path / "gone.toml").symlink_to(tmp_path / "nowhere.toml")
    with pytest.raises(FileNotFoundError, match="config file .*gone.toml not found"):
        read_toml(tmp_path / "gone.toml")


def test_windows_line_endings_read_as_unix_ones(tmp_path):
    path = tmp_path / "crlf.toml"
    path.write_bytes(b'seed = 3\r\n[data]\r\nroot = "x"\r\n')
    assert read_toml(path) == {"seed": 3, "data": {"root": "x"}}


@pytest.mark.parametrize(
    "text, value",
    [
        ("0.5", 0.5),
        ("1e-4", 1e-4),
        ("3", 3),
        ("true", True),
        ('"run 1"', "run 1"),
        ("'C:\\x'", "C:\\x"),
        ("[25, 50]", [25, 50]),
        ("{a = 1}", {"a": 1}),
        ("-inf", -math.inf),
    ],
)
def test_parse_value_reads_one_toml_value(text, value):
    assert parse_value(text) == value
    assert type(parse_value(text)) is type(value)


@pytest.mark.parametrize("text", ["bare words", '"unclosed', "[1, 2", "1, b = 2", ""])
def test_parse_value_refuses_what_is_not_one_value(text):
    with pytest.raises(TOMLDecodeError):
        parse_value(text)


def test_check_value_names_the_key_of_what_toml_cannot_hold():
    check_value({"a": [1, 2.5, "x", True, {"b": []}]}, "model.options")  # holds
    with pytest.raises(TypeError, match=r"model\.options\.a\[1\] must be a string, .*NoneType"):
        check_value({"a": [1, None]}, "model.options")
    with pytest.raises(TypeError, match=r"model\.options must be .* got dict \{1: 2\}"):
        check_value({1: 2}, "model.options")
    with pytest.raises(ValueError, match=r"name holds a character UTF-8 cannot encode"):
        check_value("bad \ud800", "name")
    with pytest.raises(ValueError, match=r"model\.options \(a key\) holds a character"):
        check_value({"\udc00": 1}, "model.options")
