"""ResNet grid encoder (TVmax paper, Sec. 3-4: 256 x 256 image -> 8 x 8 x 2048 feature map).

The grid is the output of ResNet stage ``layer4`` (stride 32), as in the paper, or of ``layer3``
(stride 16: a 16 x 16 grid of half as many channels at 256 px, each cell seeing a smaller part of
the image).

Weights come from torchvision's weights enums (``torchvision.models.get_model_weights``), from
a local ``state_dict`` file, or nowhere (random initialization). Named weights are read from the
torch hub cache when present (checked against the SHA-256 prefix in the file's name);
otherwise they are downloaded, and when that fails (offline machine) the error says where to
put the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torchvision
from torch import Tensor, nn

from data_prep.hashes import file_sha256
from data_prep.paths import require_file
from data_prep.wording import first_names

ARCHITECTURES = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
LAYERS = ("layer3", "layer4")


class EncoderWeightsError(RuntimeError):
    """Named or local encoder weights could not be loaded."""


class GridEncoder(nn.Module):
    """ResNet without its pooling and classifier: images -> grid features.

    forward: ``(B, 3, H, W)`` float (ImageNet-normalized) -> ``(B, H/s, W/s, C)`` float, with
    stride s = 32 (``layer4``) or 16 (``layer3``). A frozen encoder (``trainable=False``) keeps
    batch norm in eval mode and builds no graph.

    Attributes:
        channels: C (layer4: 512 for resnet18/34, 2048 for the deeper ones; layer3: half).
        arch: torchvision architecture name.
        layer: the last ResNet stage kept.
        trainable: whether the encoder is fine-tuned.
        weights_source: where :func:`build_encoder` read its weights: the absolute path of a
            local file, or torchvision's weights name (``ResNet101_Weights.IMAGENET1K_V2``);
            None for a random initialization.
        weights_sha256: the SHA-256 of that file's bytes (hex), or None.
    """

    def __init__(
        self, resnet: torchvision.models.ResNet, arch: str, trainable: bool, layer: str = "layer4"
    ):
        super().__init__()
        _check_layer(layer)
        stages = [resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4]
        kept = stages[: LAYERS.index(layer) + 3]
        self.trunk = nn.Sequential(resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool, *kept)
        # Every ResNet stage doubles the channels of the one before.
        self.channels = resnet.fc.in_features // 2 ** (len(stages) - len(kept))
        self.arch = arch
        self.layer = layer
        self.trainable = trainable
        self.weights_source: str | None = None
        self.weights_sha256: str | None = None
        self.trunk.requires_grad_(trainable)
        if not trainable:
            self.trunk.eval()

    def train(self, mode: bool = True) -> GridEncoder:
        super().train(mode)
        if not self.trainable:
            self.trunk.eval()
        return self

    def forward(self, images: Tensor) -> Tensor:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"encoder expects images (B, 3, H, W), got {tuple(images.shape)}")
        with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
            return self.trunk(images).permute(0, 2, 3, 1)

    def extra_repr(self) -> str:
        return (
            f"arch={self.arch}, layer={self.layer}, channels={self.channels}, "
            f"trainable={self.trainable}"
        )


def build_encoder(
    arch: str = "resnet101",
    weights: str | os.PathLike | None = None,
    trainable: bool = False,
    layer: str = "layer4",
) -> GridEncoder:
    """Build a ResNet grid encoder.

    Args:
        arch: one of :data:`ARCHITECTURES`.
        weights: ``None`` (random init), a torchvision weights name of ``arch``
            (``"IMAGENET1K_V2"`` or ``"ResNet101_Weights.IMAGENET1K_V2"``), or the path of a
            local ``state_dict`` file of the torchvision ResNet (the ``fc`` entries may be
            absent).
        trainable: fine-tune the encoder (else frozen).
        layer: the last ResNet stage kept, ``"layer4"`` (the paper) or ``"layer3"``.

    Raises:
        ValueError: unknown architecture, layer or weights name.
        EncoderWeightsError: the weights file cannot be read, does not fit ``arch``, or named
            weights are neither cached nor downloadable.
    """
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown encoder arch {arch!r}; valid: {', '.join(ARCHITECTURES)}")
    _check_layer(layer)
    resnet = torchvision.models.get_model(arch, weights=None)
    if weights is None:
        return GridEncoder(resnet, arch, trainable, layer)
    local = _looks_like_path(weights)
    if local:
        file, named = Path(weights), None
        state_dict, source = _read_state_dict(file), str(weights)
    else:
        (state_dict, source), named = _named_state_dict(arch, str(weights))
        file = Path(source)
    _load_trunk(resnet, arch, state_dict, source, layer)
    if local:
        _check_pretrained_layer(file, layer)
    encoder = GridEncoder(resnet, arch, trainable, layer)
    encoder.weights_source = named or str(file.resolve())
    encoder.weights_sha256 = file_sha256(file)
    return encoder


def _check_layer(layer: str) -> None:
    if layer not in LAYERS:
        raise ValueError(f"unknown encoder layer {layer!r}; valid: {', '.join(LAYERS)}")


def later_stages(layer: str) -> tuple[str, ...]:
    """The state_dict key prefixes of the ResNet stages after ``layer``, which a grid encoder
    of ``layer`` leaves out (``("layer4.",)`` for layer3)."""
    return tuple(f"{stage}." for stage in LAYERS[LAYERS.index(layer) + 1:])


def _looks_like_path(weights: str | os.PathLike) -> bool:
    text = os.fspath(weights)
    return (
        isinstance(weights, os.PathLike)
        or os.sep in text
        or text.endswith((".pt", ".pth", ".ckpt", ".bin"))
        or Path(text).exists()
    )


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    from captioner.checkpointing import CheckpointError, load_safely

    try:
        state_dict = load_safely(require_file(path, "encoder weights file"))
    except CheckpointError as exc:
        raise EncoderWeightsError(f"encoder weights file {exc}") from None
    except (OSError, ValueError) as exc:
        raise EncoderWeightsError(str(exc)) from None
    if not isinstance(state_dict, dict) or not all(
        isinstance(v, Tensor) for v in state_dict.values()
    ):
        raise EncoderWeightsError(
            f"encoder weights file {path} does not hold a state_dict (a dict of tensors)"
        )
    return state_dict


def pretraining_report_path(weights_path: str | Path) -> Path:
    """Where ``pretrain-encoder`` writes the report of the weights it writes to
    ``weights_path`` (its settings, classes and accuracy), which the encoder reads back."""
    return Path(weights_path).with_suffix(".json")


def _check_pretrained_layer(path: Path, layer: str) -> None:
    """Refuse weights that ``pretrain-encoder`` trained up to an earlier stage than ``layer``,
    as its report beside them says. Files that earlier versions of it wrote hold the stages
    after that one too, untrained: their keys fit, and the features would come from random weights.
    A file beside them that is not such a report is not read as one."""
    report = pretraining_report_path(path)
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not (isinstance(data, dict) and "val_cell_accuracy" in data):
        return
    held = data.get("layer")
    if held in LAYERS and LAYERS.index(held) < LAYERS.index(layer):
        raise EncoderWeightsError(
            f"encoder weights from {path} were pretrained up to {held} ({report}), not "
            f"{layer}: the stages after {held} are untrained; set the encoder layer to {held}")


def _named_state_dict(arch: str, name: str) -> tuple[tuple[dict[str, Tensor], str], str]:
    """((state_dict, the hub-cache file it was read from), the weights' full name) of
    torchvision's weights ``name`` of ``arch``."""
    enum = torchvision.models.get_model_weights(arch)
    member = name
    if "." in name:
        prefix, member = name.split(".", 1)
        if prefix != enum.__name__:
            raise ValueError(
                f"encoder weights {name!r} do not belong to {arch} (expected {enum.__name__}.*)"
            )
    if member not in enum.__members__:
        raise ValueError(
            f"unknown weights {name!r} for {arch}; valid: {', '.join(enum.__members__)}, "
            "or a local state_dict file"
        )
    url = enum[member].url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)
    full_name = f"{enum.__name__}.{member}"
    if cached.is_file():
        _check_name_hash(cached, url)
        return (_read_state_dict(cached), str(cached)), full_name
    try:
        # Into the hub cache, as torch.hub.load_state_dict_from_url would, but without its
        # "Downloading: ..." line, printed before it connects: offline, our error stands alone.
        # The SHA-256 prefix in the file name is checked, as torchvision's builders do.
        cached.parent.mkdir(parents=True, exist_ok=True)
        digest = torch.hub.HASH_REGEX.search(cached.name)
        torch.hub.download_url_to_file(url, str(cached), digest and digest.group(1),
                                       progress=True)
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise EncoderWeightsError(
            f"encoder weights {enum.__name__}.{member} are not in the torch hub cache and "
            f"could not be downloaded ({reason}); expected file: {cached} (download {url} on a "
            "machine with network access and place it there; TORCH_HOME moves the cache), or "
            "pass the path of a local state_dict file as the weights, or use a random "
            "initialization (prepare-features --weights none saves it beside the cache as "
            "NAME.encoder.pt, the file to train with as model.encoder_weights)"
        ) from exc
    return (_read_state_dict(cached), str(cached)), full_name


def _check_name_hash(path: Path, url: str) -> None:
    """Refuse a hub-cache file whose bytes do not have the SHA-256 prefix its name gives
    (``resnet101-cd907fc2.pth``): torchvision checks it only while downloading, so a file
    placed there by hand (a partial copy, other weights under this name) would load unchecked
    and make every feature another encoder's."""
    match = torch.hub.HASH_REGEX.search(path.name)
    if match is None:
        return
    expected = match.group(1)
    digest = file_sha256(path)
    if not digest.startswith(expected):
        raise EncoderWeightsError(
            f"encoder weights file {path}: its SHA-256 begins {digest[:len(expected)]}, not "
            f"{expected} as its name says: not the file torchvision publishes (a partial copy, "
            f"or other weights under this name); replace it with {url}"
        )


def _trunk_keys(resnet: nn.Module) -> set[str]:
    return {k for k in resnet.state_dict() if not k.startswith("fc.")}


def _fitting_encoder(trunk_state: dict[str, Tensor], layer: str) -> str:
    """Which architecture, and layer, weights that do not fit are for, where their names tell
    (the usual mistake: a pretrain-encoder file of a resnet18 up to layer3 given to the default
    encoder): " (they are ...: set ...)", or "" when no ResNet has exactly their names."""
    given = set(trunk_state)
    for arch in ARCHITECTURES:
        keys = _trunk_keys(torchvision.models.get_model(arch, weights=None))
        if not given <= keys:
            continue
        # The deepest layer they hold whole: a file may hold the stages after it, untrained.
        for held in reversed(LAYERS):
            if {k for k in keys if not k.startswith(later_stages(held))} <= given:
                if held == layer:
                    return f" (they are {arch} weights: set the encoder arch to {arch})"
                return (f" (they are {arch} weights up to {held}: set the encoder arch to "
                        f"{arch} and the layer to {held})")
    return ""


def _load_trunk(resnet: nn.Module, arch: str, state_dict: dict[str, Tensor], source: str,
                layer: str) -> None:
    """Load a torchvision ResNet state_dict up to ``layer``; the classifier (``fc.*``) and the
    stages after ``layer`` are optional (``pretrain-encoder`` writes the ResNet up to its
    layer, the stages after it untrained)."""
    trunk_state = {k: v for k, v in state_dict.items() if not k.startswith("fc.")}
    later = later_stages(layer)
    trunk_keys = _trunk_keys(resnet)
    expected = {k for k in trunk_keys if not k.startswith(later)}
    missing = sorted(expected - trunk_state.keys())
    unexpected = sorted(trunk_state.keys() - trunk_keys)
    if missing and not unexpected and layer != LAYERS[0] and all(
            k.startswith(f"{layer}.") for k in missing):
        earlier = LAYERS[LAYERS.index(layer) - 1]
        raise EncoderWeightsError(
            f"encoder weights from {source} hold the ResNet up to {earlier}, not {layer}: set "
            f"the encoder layer to {earlier}")
    if missing or unexpected:
        keys = "; ".join(f"{kind} {first_names(names, 5)}" for kind, names in
                         (("missing", missing), ("unexpected", unexpected)) if names)
        raise EncoderWeightsError(f"encoder weights from {source} do not fit the encoder arch "
                                  f"{arch}{_fitting_encoder(trunk_state, layer)}: {keys}")
    try:
        resnet.load_state_dict(trunk_state, strict=False)
    except RuntimeError as exc:
        raise EncoderWeightsError(f"encoder weights from {source}: {exc}") from exc
