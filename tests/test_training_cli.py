"""`captioner fit|validate` (LightningCLI) and `captioner prepare-features` on tiny data,
including resume from a checkpoint and a 2-process DDP run on CPU (gloo)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from captioner.checkpointing import load_safely
from captioner.commands.lightning import main as lightning_main
from captioner.commands.prepare_features import encoder_weights_path, extract_features
from data_prep.features import FeatureCache
from eval.commands.demo import ENCODER_LAYER as DEMO_LAYER

REPO = Path(__file__).resolve().parents[1]
MAPPINGS = ("softmax", "sparsemax", "tvmax")
PAPER_CONFIGS = [f"{data}_{mapping}" for data in ("coco", "flickr30k") for mapping in MAPPINGS]


def _image_size(dataset) -> int:
    """Side of the (square) synthetic images; the tiny models use it as their input size."""
    with Image.open(next(dataset.image_root.rglob("*.png"))) as image:
        return image.width



def _print_config(config: Path, capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        lightning_main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code in (None, 0)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_configs_parse_with_the_paper_settings(name, capsys):
    config = _print_config(REPO / "configs" / f"{name}.yaml", capsys)
    model, data = config["model"], config["data"]
    assert config["trainer"]["max_epochs"] == 50
    assert (model["encoder_arch"], model["encoder_weights"]) == ("resnet101", "IMAGENET1K_V2")
    assert (model["hidden_dim"], model["embed_dim"], model["feature_dim"]) == (512, 256, 512)
    assert (model["lr"], model["betas"]) == (1e-4, [0.8, 0.999])
    assert (model["lr_decay"], model["lr_decay_after"]) == (0.99, 10)
    assert model["input_attention"] == "softmax"
    assert model["output_attention"] == name.split("_")[1]
    if name.endswith("tvmax"):
        assert model["output_attention_kwargs"] == {"lam": 0.01}
    assert data["image_size"] == 256 and data["min_count"] == 5
    assert config["checkpoint"]["monitor"] == "val/CIDEr" and config["checkpoint"]["mode"] == "max"


@pytest.mark.parametrize("mapping", MAPPINGS)
def test_demo_configs_equal_the_demo_command_settings(mapping, capsys):
    from eval.commands.demo import FULL, feature_cache_path, model_settings

    config = _print_config(REPO / "configs" / f"demo_{mapping}.yaml", capsys)
    cache = feature_cache_path(Path("demo_out"), FULL)
    expected = model_settings(mapping, FULL, str(encoder_weights_path(cache)))
    assert config["data"]["image_size"] == expected.pop("image_size")  # linked to the model
    model = {key: config["model"][key] for key in expected}
    assert model == expected
    assert config["data"]["feature_cache"] == str(cache)
    assert config["data"]["batch_size"] == FULL.batch_size
    assert config["trainer"]["max_epochs"] == FULL.epochs


@pytest.fixture(scope="module")
def tiny_cache(synthetic_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("features") / "features_resnet18.h5"
    extract_features(
        synthetic_data.karpathy_json, synthetic_data.image_root, out, arch="resnet18",
        layer=DEMO_LAYER, weights=None, image_size=_image_size(synthetic_data), batch_size=8,
        num_workers=0, progress=False,
    )
    return out


def test_prepare_features_records_the_encoder(tiny_cache, synthetic_data):
    cache = FeatureCache(tiny_cache)
    assert cache.encoder["arch"] == "resnet18"
    assert cache.encoder["image_size"] == _image_size(synthetic_data)
    assert Path(cache.encoder["weights"]).is_file()  # random init saved for the model
    assert cache.encoder["layer"] == DEMO_LAYER
    assert cache.grid == (8, 8) and cache.channels == 256
    images = json.loads(synthetic_data.karpathy_json.read_text())["images"]
    assert len(cache) == len(images)
    assert cache.get(images[0]["cocoid"]).dtype.name == "float16"


def _cli_args(dataset, cache: Path, out: Path, *extra: str) -> list[str]:
    weights = FeatureCache(cache).encoder["weights"]
    return [
        "--config", str(REPO / "configs" / "demo_softmax.yaml"),
        "--data.karpathy_json", str(dataset.karpathy_json),
        "--data.image_root", str(dataset.image_root),
        "--data.feature_cache", str(cache),
        "--data.image_size", str(_image_size(dataset)),
        "--data.batch_size", "8",
        "--data.eval_batch_size", "4",
        "--model.encoder_weights", weights,
        "--model.hidden_dim", "32", "--model.feature_dim", "32", "--model.embed_dim", "16",
        "--model.max_length", "8", "--model.beam_size", "2",
        "--trainer.limit_train_batches", "2",
        "--trainer.limit_val_batches", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(out),
        "--trainer.logger.init_args.save_dir", str(out / "logs"),
        "--checkpoint.dirpath", str(out / "checkpoints"),
        *extra,
    ]


def test_fit_validate_and_resume_through_the_cli(synthetic_data, tiny_cache, tmp_path):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path)
    assert lightning_main(["fit", *args, "--trainer.max_epochs", "1"]) == 0
    last = tmp_path / "checkpoints" / "last.ckpt"
    best = sorted((tmp_path / "checkpoints").glob("best-*.ckpt"))
    assert len(best) == 1 and last.is_file()
    assert load_safely(last)["global_step"] == 2

    # Resume: the second epoch continues from step 2 with the restored optimizer state.
    resume = ["--trainer.max_epochs", "2", "--ckpt_path", str(last)]
    assert lightning_main(["fit", *args, *resume]) == 0
    resumed = load_safely(last)
    assert resumed["global_step"] == 4
    assert resumed["vocabulary"] == load_safely(best[0])["vocabulary"]

    assert lightning_main(["validate", *args, "--ckpt_path", str(best[0])]) == 0
    metrics = list(csv.DictReader(next((tmp_path / "logs").rglob("metrics.csv")).open()))
    assert any(row.get("val/CIDEr") for row in metrics)


def test_missing_cache_key_is_an_error_naming_it(synthetic_data, tiny_cache, tmp_path):
    raw = json.loads(synthetic_data.karpathy_json.read_text())
    raw["images"][0]["cocoid"] = 987654
    broken = tmp_path / "dataset_extra.json"
    broken.write_text(json.dumps(raw))
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--data.karpathy_json", str(broken))
    with pytest.raises(FileNotFoundError, match="987654"):
        lightning_main(["fit", *args, "--trainer.max_epochs", "1"])


def test_cache_of_another_encoder_is_refused(synthetic_data, tiny_cache, tmp_path):
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--model.encoder_arch", "resnet34",
                     "--model.encoder_weights", "null")
    with pytest.raises(ValueError, match="arch='resnet18'.*resnet34"):
        lightning_main(["fit", *args, "--trainer.max_epochs", "1"])
    args = _cli_args(synthetic_data, tiny_cache, tmp_path, "--model.encoder_layer", "layer4")
    with pytest.raises(ValueError, match="layer='layer3'.*layer='layer4'"):
        lightning_main(["fit", *args, "--trainer.max_epochs", "1"])


def test_two_process_ddp_on_cpu(synthetic_data, tiny_cache, tmp_path):
    args = _cli_args(
        synthetic_data, tiny_cache, tmp_path,
        "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
        "--trainer.max_epochs", "1",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PL_DISABLE_FORK": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "captioner.cli", "fit", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "distributed_backend=gloo" in run.stderr + run.stdout
    assert "All distributed processes registered" in run.stderr + run.stdout
    checkpoint = load_safely(tmp_path / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 2  # per process: 2 batches of the sharded data
    metrics = list(csv.DictReader(next((tmp_path / "logs").rglob("metrics.csv")).open()))
    assert any(row.get("val/CIDEr") for row in metrics)
