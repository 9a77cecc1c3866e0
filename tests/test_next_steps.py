"""The "next:" commands of ``prepare-dataset`` and ``prepare-features`` run as printed: each is
parsed by the command it names (``fit`` through LightningCLI, ``--print_config``), and the fit
that prepare-features prints accepts the cache it made."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from captioner import CONFIGS
from captioner.cli import main as cli_main
from captioner.commands.prepare_features import build_parser as prepare_features_parser
from captioner.features.cache_check import CACHE_SETTINGS, check_feature_cache
from captioner.features.next_steps import CPU_SETUP, GPU_SETUP, machine_setup
from data_prep.features import FeatureCache


def _printed(stdout: str, command: str) -> list[str]:
    """The arguments of the "next:" line that runs ``captioner COMMAND``, as a shell splits it."""
    line = next(line for line in stdout.splitlines()
                if line.strip().startswith(f"captioner {command} "))
    words = shlex.split(line)
    assert words[:2] == ["captioner", command]
    return words[2:]


def _fit_config(capsys, args: list[str]) -> dict:
    """The config that ``captioner fit ARGS`` would train with."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli_main(["fit", *args, "--print_config"])
    assert done.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def _cache_settings(config: dict) -> dict:
    """The settings of ``config`` that check_feature_cache compares with a cache's encoder."""
    section = {"model": config["model"], "data": config["data"]}
    settings = {option: section[option.split(".")[0]][option.split(".")[1]]
                for option in CACHE_SETTINGS.values()}
    settings["model.encoder_trainable"] = config["model"]["encoder_trainable"]
    return settings


@pytest.mark.parametrize("setup", [CPU_SETUP, GPU_SETUP], ids=["cpu", "gpu"])
def test_each_setup_is_its_configs_encoder(capsys, setup):
    config = _fit_config(capsys, ["--config", str(CONFIGS / setup.config)])
    assert _cache_settings(config) == {
        "model.encoder_arch": setup.arch, "model.encoder_layer": setup.layer,
        "model.encoder_weights": setup.weights, "data.image_size": setup.image_size,
        "model.encoder_trainable": False,
    }


def _synthetic(tmp_path: Path, capsys) -> tuple[Path, Path]:
    out = tmp_path / "synthetic"
    assert cli_main(["prepare-synthetic", "--out", str(out), "--train", "4", "--val", "2",
                     "--test", "2", "--image-size", "64", "--no-progress"]) == 0
    capsys.readouterr()
    return out / "dataset_synthetic.json", out / "images"


def test_prepare_features_prints_a_fit_that_takes_its_cache(tmp_path, capsys):
    data, images = _synthetic(tmp_path, capsys)
    cache = tmp_path / "features_synthetic_resnet18_layer3.h5"
    # --weights none: no download; fit must be given the weights file written beside the cache.
    assert cli_main(["prepare-features", "--data", str(data), "--images", str(images),
                     "--arch", "resnet18", "--layer", "layer3", "--weights", "none",
                     "--image-size", "64", "--out", str(cache), "--num-workers", "0",
                     "--no-progress"]) == 0
    fit = _printed(capsys.readouterr().out, "fit")
    config = _fit_config(capsys, fit)
    assert config["data"]["karpathy_json"] == str(data)
    assert config["data"]["image_root"] == str(images)
    assert config["data"]["feature_cache"] == str(cache)
    assert config["trainer"]["logger"]["init_args"]["name"] == "synthetic_tvmax"
    assert Path(fit[fit.index("--config") + 1]) == CONFIGS / machine_setup().config
    settings = _cache_settings(config)
    assert settings["model.encoder_weights"] == str(cache.with_name(
        "features_synthetic_resnet18_layer3.encoder.pt").resolve())
    with FeatureCache(cache) as opened:
        check_feature_cache(settings, opened)  # raises for a mismatch


def test_prepare_dataset_prints_features_and_fit_of_one_encoder_and_cache(tmp_path, capsys):
    data, images = _synthetic(tmp_path, capsys)
    captions = tmp_path / "captions.jsonl"
    dataset = json.loads(data.read_text())
    captions.write_text("".join(
        json.dumps({"image": f"{r['filepath']}/{r['filename']}".lstrip("/"),
                    "captions": [s["raw"] for s in r["sentences"]]}) + "\n"
        for r in dataset["images"]))
    out = tmp_path / "mine" / "dataset_mine.json"
    assert cli_main(["prepare-dataset", "--captions", str(captions), "--images", str(images),
                     "--out", str(out), "--split", "4,2,2", "--no-progress"]) == 0
    stdout = capsys.readouterr().out
    setup = machine_setup()
    features = prepare_features_parser().parse_args(_printed(stdout, "prepare-features"))
    assert (features.data, features.images) == (out, images)
    assert (features.arch, features.layer, features.weights, features.image_size) == (
        setup.arch, setup.layer, setup.weights, setup.image_size)
    # Named after the dataset and the encoder: two datasets in one folder get two caches.
    assert features.out == out.with_name(f"features_mine_{setup.arch}_{setup.layer}.h5")
    config = _fit_config(capsys, _printed(stdout, "fit"))
    assert config["data"]["feature_cache"] == str(features.out)
    assert config["data"]["karpathy_json"] == str(out)
    assert config["trainer"]["logger"]["init_args"]["name"] == "mine_tvmax"
    assert _cache_settings(config) == {
        "model.encoder_arch": setup.arch, "model.encoder_layer": setup.layer,
        "model.encoder_weights": setup.weights, "data.image_size": setup.image_size,
        "model.encoder_trainable": False,
    }
