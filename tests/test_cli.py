import pytest

from snens.cli import build_parser, main


def test_help_lists_the_demo(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "demo" in out
    assert "exit status: 0 done; 1 a run failed on the way" in out  # what scripts can rely on


def test_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["dance"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'dance'" in capsys.readouterr().err
