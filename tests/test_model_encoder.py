"""ResNet grid encoder: grid shapes, frozen/fine-tuned modes, weights from files, cache, offline."""

from __future__ import annotations

import email.message
import enum
import hashlib
import os
import re
import urllib.error
import urllib.response

import pytest
import torch
import torchvision

from captioner.model.encoder import EncoderWeightsError, build_encoder


@pytest.fixture
def hub_dir(tmp_path, monkeypatch):
    """An empty torch hub cache; downloads fail as on an offline machine."""
    previous = torch.hub.get_dir()
    torch.hub.set_dir(str(tmp_path / "hub"))

    def offline(request, *args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(torch.hub, "urlopen", offline)
    yield tmp_path / "hub"
    torch.hub.set_dir(previous)


def resnet18_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return torchvision.models.resnet18(weights=None).state_dict()


def test_grid_shape_and_channels():
    encoder = build_encoder("resnet18")
    features = encoder(torch.randn(1, 3, 256, 256))
    assert features.shape == (1, 8, 8, 512) and encoder.channels == 512
    assert build_encoder("resnet50").channels == 2048


def test_layer3_grid_is_torchvisions_layer3_output(tmp_path):
    from torchvision.models.feature_extraction import create_feature_extractor

    state = resnet18_state(seed=4)
    torch.save(state, tmp_path / "resnet18.pth")
    encoder = build_encoder("resnet18", weights=tmp_path / "resnet18.pth", layer="layer3")
    resnet = torchvision.models.resnet18(weights=None)
    resnet.load_state_dict(state)
    images = torch.randn(2, 3, 256, 256)
    expected = create_feature_extractor(resnet.eval(), {"layer3": "grid"})(images)["grid"]
    features = encoder(images)
    assert encoder.channels == 256 and features.shape == (2, 16, 16, 256)
    torch.testing.assert_close(features, expected.permute(0, 2, 3, 1))
    assert build_encoder("resnet50", layer="layer3").channels == 1024


def test_frozen_encoder_keeps_batch_norm_in_eval_and_builds_no_graph():
    encoder = build_encoder("resnet18", trainable=False).train()
    assert not any(m.training for m in encoder.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert not any(p.requires_grad for p in encoder.parameters())
    assert not encoder(torch.randn(1, 3, 64, 64)).requires_grad


def test_trainable_encoder_gets_gradients():
    encoder = build_encoder("resnet18", trainable=True).train()
    encoder(torch.randn(2, 3, 64, 64)).sum().backward()
    assert encoder.trunk[0].weight.grad is not None
    assert encoder.trunk[1].training


def test_local_state_dict_file_is_loaded(tmp_path):
    state = resnet18_state(seed=3)
    path = tmp_path / "resnet18.pth"
    torch.save(state, path)
    encoder = build_encoder("resnet18", weights=str(path))
    torch.testing.assert_close(encoder.trunk[0].weight, state["conv1.weight"])
    torch.testing.assert_close(
        encoder.trunk[7][1].bn2.running_var, state["layer4.1.bn2.running_var"]
    )

    without_classifier = {k: v for k, v in state.items() if not k.startswith("fc.")}
    torch.save(without_classifier, tmp_path / "trunk.pt")
    encoder = build_encoder("resnet18", weights=tmp_path / "trunk.pt")
    torch.testing.assert_close(encoder.trunk[0].weight, state["conv1.weight"])


@pytest.mark.slow
def test_bad_local_files_are_named(tmp_path):
    with pytest.raises(EncoderWeightsError, match="encoder weights file not found: .*missing.pt"):
        build_encoder("resnet18", weights=str(tmp_path / "missing.pt"))
    torch.save(resnet18_state(seed=0), tmp_path / "r18.pt")
    with pytest.raises(EncoderWeightsError, match="r18.pt do not fit the encoder arch resnet34 "
                       r"\(they are resnet18 weights: set the encoder arch to resnet18\)"):
        build_encoder("resnet34", weights=str(tmp_path / "r18.pt"))
    # A pretrain-encoder file (a resnet18 up to layer3) given to another arch and layer.
    torch.save({k: v for k, v in resnet18_state(seed=0).items() if not k.startswith("layer4.")},
               tmp_path / "r18_layer3.pt")
    with pytest.raises(EncoderWeightsError, match="r18_layer3.pt do not fit the encoder arch "
                       r"resnet50 \(they are resnet18 weights up to layer3: set the encoder "
                       r"arch to resnet18 and the layer to layer3\)"):
        build_encoder("resnet50", weights=str(tmp_path / "r18_layer3.pt"))
    odd = {"conv1.weight": torch.zeros(1), "head.weight": torch.zeros(1)}  # no architecture's
    torch.save(odd, tmp_path / "odd.pt")
    with pytest.raises(EncoderWeightsError, match=(
            r"odd.pt do not fit the encoder arch resnet18: missing bn1\.bias, "
            r"bn1\.num_batches_tracked, bn1\.running_mean, bn1\.running_var, bn1\.weight and "
            r"114 more; unexpected head\.weight$")):
        build_encoder("resnet18", weights=str(tmp_path / "odd.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(EncoderWeightsError,
                       match="encoder weights file .*junk.pt: not a torch checkpoint"):
        build_encoder("resnet18", weights=str(tmp_path / "junk.pt"))
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(EncoderWeightsError, match="list.pt: holds a list, not a checkpoint"):
        build_encoder("resnet18", weights=str(tmp_path / "list.pt"))


def test_named_weights_come_from_the_hub_cache(hub_dir, monkeypatch, tmp_path):
    state = resnet18_state(seed=5)
    requested = _serve(monkeypatch, tmp_path, state)
    cached = hub_dir / "checkpoints" / os.path.basename(_ServedWeights.served_url)
    cached.parent.mkdir(parents=True)
    cached.write_bytes((tmp_path / "served.pth").read_bytes())  # placed by hand, offline
    for name in ("IMAGENET1K_V1", "_ServedWeights.IMAGENET1K_V1", "DEFAULT"):
        encoder = build_encoder("resnet18", weights=name)
        torch.testing.assert_close(encoder.trunk[0].weight, state["conv1.weight"])
    assert requested == []


def test_a_hub_cache_file_that_does_not_match_the_hash_in_its_name_is_refused(
        hub_dir, monkeypatch, tmp_path):
    # Other weights under torchvision's name, as a hand copy offline may put them: they would
    # load, and every feature would be another encoder's.
    _serve(monkeypatch, tmp_path, resnet18_state(seed=5))
    cached = hub_dir / "checkpoints" / os.path.basename(_ServedWeights.served_url)
    cached.parent.mkdir(parents=True)
    torch.save(resnet18_state(seed=6), cached)
    actual = hashlib.sha256(cached.read_bytes()).hexdigest()[:8]
    expected = cached.stem.rsplit("-", 1)[1]
    with pytest.raises(EncoderWeightsError, match=(
            f"encoder weights file {re.escape(str(cached))}: its SHA-256 begins {actual}, not "
            f"{expected} as its name says: .*replace it with "
            f"{re.escape(_ServedWeights.served_url)}$")):
        build_encoder("resnet18", weights="IMAGENET1K_V1")


def test_offline_without_cache_says_where_to_put_the_file(hub_dir, capfd):
    url = torchvision.models.ResNet18_Weights.IMAGENET1K_V1.url
    expected_path = hub_dir / "checkpoints" / os.path.basename(url)
    with pytest.raises(EncoderWeightsError) as error:
        build_encoder("resnet18", weights="ResNet18_Weights.IMAGENET1K_V1")
    assert capfd.readouterr() == ("", "")  # no "Downloading: ..." before the error
    assert sorted(expected_path.parent.iterdir()) == []  # no partial download left
    message = str(error.value)
    assert str(expected_path) in message
    assert url in message
    assert "local state_dict file" in message
    assert "network is unreachable" in message


class _ServedWeights(enum.Enum):
    """A weights enum whose file is served by :func:`_serve` (``url`` set by the test)."""

    IMAGENET1K_V1 = "served"
    DEFAULT = "served"  # an alias, as in torchvision's enums

    @property
    def url(self) -> str:
        return _ServedWeights.served_url


def _serve(monkeypatch, tmp_path, state: dict, name_hash: str | None = None) -> list[str]:
    """Serve ``state`` as resnet18's weights, named with the SHA-256 prefix of its bytes (or
    ``name_hash``); returns the list of URLs requested."""
    served = tmp_path / "served.pth"
    torch.save(state, served)
    digest = name_hash or hashlib.sha256(served.read_bytes()).hexdigest()[:8]
    _ServedWeights.served_url = f"https://weights.example/resnet18-{digest}.pth"
    requested = []

    def online(request, *args, **kwargs):
        requested.append(request.full_url)
        return urllib.response.addinfourl(open(served, "rb"), email.message.Message(),
                                          request.full_url, 200)

    monkeypatch.setattr(torch.hub, "urlopen", online)
    monkeypatch.setattr(torchvision.models, "get_model_weights", lambda arch: _ServedWeights)
    return requested


def test_online_named_weights_are_downloaded_into_the_hub_cache(hub_dir, monkeypatch, tmp_path):
    state = resnet18_state(seed=7)
    requested = _serve(monkeypatch, tmp_path, state)
    encoder = build_encoder("resnet18", weights="IMAGENET1K_V1")
    assert requested == [_ServedWeights.served_url]
    torch.testing.assert_close(encoder.trunk[0].weight, state["conv1.weight"])
    cached = hub_dir / "checkpoints" / os.path.basename(_ServedWeights.served_url)
    assert cached.read_bytes() == (tmp_path / "served.pth").read_bytes()
    requested.clear()
    build_encoder("resnet18", weights="IMAGENET1K_V1")  # from the cache now
    assert requested == []


def test_a_download_that_does_not_match_the_hash_in_its_name_is_refused(
        hub_dir, monkeypatch, tmp_path):
    _serve(monkeypatch, tmp_path, resnet18_state(seed=7), name_hash="00000000")
    with pytest.raises(EncoderWeightsError, match="invalid hash value"):
        build_encoder("resnet18", weights="IMAGENET1K_V1")
    assert list((hub_dir / "checkpoints").iterdir()) == []  # nothing left in the cache


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="unknown encoder arch 'resnet7'"):
        build_encoder("resnet7")
    with pytest.raises(ValueError, match="unknown encoder layer 'layer2'; valid: layer3, layer4"):
        build_encoder("resnet18", layer="layer2")
    with pytest.raises(ValueError, match="unknown weights 'IMAGENET9' for resnet18; valid: "):
        build_encoder("resnet18", weights="IMAGENET9")
    with pytest.raises(ValueError, match="do not belong to resnet18"):
        build_encoder("resnet18", weights="ResNet50_Weights.IMAGENET1K_V2")
    with pytest.raises(ValueError, match=r"images \(B, 3, H, W\)"):
        build_encoder("resnet18")(torch.randn(1, 4, 32, 32))
