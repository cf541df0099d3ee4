"""Write configs/<preset>.toml for every preset, from snens.presets (the one source).

python scripts/write_configs.py          # after changing a preset or a default
tests/test_config.py::test_config_files_are_the_presets fails until this has been run.
"""

from pathlib import Path

from snens.config import to_toml
from snens.presets import PRESETS, preset

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def text(name: str) -> str:
    return (
        f"# preset {name}: snens train --config configs/{name}.toml (or --preset {name})\n"
        "# every key; units in snens/config.py; written by scripts/write_configs.py\n"
        + to_toml(preset(name))
    )


def main() -> None:
    CONFIGS.mkdir(exist_ok=True)
    for name in PRESETS:
        (CONFIGS / f"{name}.toml").write_text(text(name), encoding="utf-8")
    for stale in sorted(set(p.stem for p in CONFIGS.glob("*.toml")) - set(PRESETS)):
        (CONFIGS / f"{stale}.toml").unlink()


if __name__ == "__main__":
    main()
