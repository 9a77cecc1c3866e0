"""Lightning training of the captioner (TVmax paper, Sec. 3-4).

One :class:`CaptioningModule` trains one model: a ResNet grid encoder and an LSTM decoder with
input and output visual attention whose mappings are chosen by name. Training minimizes the
word loss (cross-entropy, or a Fenchel-Young loss for sparse output mappings) over every
image-caption pair; validation decodes one caption per image with beam search and scores the
corpus with pycocoevalcap's BLEU and CIDEr-D scorers, logged as ``val/Bleu_4`` and
``val/CIDEr`` (the best checkpoint is chosen on ``val/CIDEr``). Every checkpoint also holds the
vocabulary (``checkpoint["vocabulary"]``), so it is self-contained.

Paper settings (Sec. 4) are the defaults: Adam with lr 1e-4 and betas (0.8, 0.999), learning
rate x0.99 per epoch after the 10th epoch, d = 512, word embeddings of 256, g = 512.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from pycocoevalcap.bleu.bleu import Bleu
from torch import Tensor

from captioner.attention import DeferredChecks
from captioner.checkpointing import (
    CheckpointError,
    constructor_arguments,
    optimizer_state_problem,
    weights_mismatch,
)
from captioner.cider import cider_d
from captioner.model.caption_model import CaptionModel
from captioner.model.decoder import AttentionDecoder
from captioner.model.decoding import Hypothesis, beam_search, check_search_memory
from captioner.model.decoding_options import DecodingOptions
from captioner.model.encoder import build_encoder
from captioner.model.frozen_encoder import leave_out_encoder, put_back_encoder
from captioner.model.losses import check_output_mapping, teacher_forced_loss
from captioner.training.optimizer import PAPER_BETAS, PAPER_LR, adam
from data_prep.features import FeatureCache
from data_prep.hashes import file_sha256
from data_prep.images import MAX_IMAGE_SIZE
from data_prep.settings_files import check_integers
from data_prep.vocab import Vocabulary

VOCABULARY_KEY = "vocabulary"
# The metrics a fit logs, which its best checkpoint can be chosen by (--checkpoint.monitor):
# the training loss every step, and corpus_scores' BLEU-4 and CIDEr-D of every validation.
LOGGED_METRICS = ("train/loss", "val/Bleu_4", "val/CIDEr")
# Hyperparameters of earlier versions that became fields of ``decoding``.
_LEGACY_DECODING_KEYS = ("beam_size", "max_length")


def lr_decay_factor(epoch: int, *, decay: float, decay_after: int) -> float:
    """Learning-rate factor of 0-based ``epoch``: 1 for the first ``decay_after`` epochs, then
    ``decay`` per further epoch (paper: after the 10th epoch, x0.99 per epoch)."""
    return decay ** max(0, epoch - decay_after + 1)


def _check_settings(image_size: int, lr: float, betas: Any, lr_decay: float,
                    lr_decay_after: int, clip_norm: float | None) -> None:
    """ValueError naming a setting that cannot train: torch would say so only once the fit has
    begun, in its own words, or (an image_size from a checkpoint) take all memory."""

    def finite(value: Any) -> bool:
        return (isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value))

    for name, value, ok, rule in (
        ("image_size", image_size, isinstance(image_size, int) and not isinstance(
            image_size, bool) and 1 <= image_size <= MAX_IMAGE_SIZE,
         f"an integer in [1, {MAX_IMAGE_SIZE}]"),
        ("lr", lr, finite(lr) and lr >= 0, "a number >= 0"),  # 0: weights kept, as torch
        ("betas", betas, isinstance(betas, list | tuple) and len(betas) == 2
         and all(finite(b) and 0 <= b < 1 for b in betas), "two numbers in [0, 1)"),
        ("lr_decay", lr_decay, finite(lr_decay) and lr_decay > 0, "a number > 0"),
        ("lr_decay_after", lr_decay_after, isinstance(lr_decay_after, int)
         and not isinstance(lr_decay_after, bool) and lr_decay_after >= 0, "an integer >= 0"),
        ("gradient_clip_norm", clip_norm, clip_norm is None
         or (finite(clip_norm) and clip_norm > 0), "a number > 0, or null"),
    ):
        if not ok:
            raise ValueError(f"model.{name} must be {rule}, got {value!r}")


class CaptioningModule(L.LightningModule):
    """Encoder-decoder captioner with pluggable attention mappings.

    Args:
        vocab_size: number of words including the four special tokens (linked from the data).
        encoder_arch: torchvision ResNet name (resnet18/34/50/101/152).
        encoder_weights: torchvision weights name (``IMAGENET1K_V2``), a local weights file, or
            None for random initialization.
        encoder_trainable: fine-tune the ResNet (False: frozen, as in the paper; required when
            the data come from a feature cache).
        encoder_layer: last ResNet stage kept: ``layer4`` (stride 32, the paper: 8 x 8 grid at
            256 px) or ``layer3`` (stride 16: 16 x 16 grid).
        image_size: input images are resized to this square size (paper: 256 -> 8 x 8 grid).
        input_attention / output_attention: names in :data:`captioner.attention.MAPPINGS`;
            the paper uses softmax input attention and varies the output attention.
        input_attention_kwargs / output_attention_kwargs: e.g. ``{"lam": 0.01}`` for TVmax.
        output_mapping: word distribution and loss: softmax (cross-entropy), sparsemax or
            entmax15 (Fenchel-Young losses).
        feature_dim / embed_dim / hidden_dim: g, word embedding size, LSTM hidden size d.
        attention_dim: hidden size of the additive attention score networks.
        dropout: dropout of the decoder.
        lr, betas: Adam settings.
        lr_decay, lr_decay_after: learning rate x ``lr_decay`` per epoch after
            ``lr_decay_after`` epochs.
        gradient_clip_norm: clip the global gradient norm to this value (None: no clipping).
        decoding: how validation and test decode captions (beam size, maximum length, ...;
            see :class:`captioner.model.decoding_options.DecodingOptions`); stored in every
            checkpoint as a dict, and the default options of inference with the checkpoint.
    """

    def __init__(
        self,
        vocab_size: int,
        encoder_arch: str = "resnet101",
        encoder_weights: str | None = "IMAGENET1K_V2",
        encoder_trainable: bool = False,
        encoder_layer: str = "layer4",
        image_size: int = 256,
        input_attention: str = "softmax",
        input_attention_kwargs: dict[str, Any] | None = None,
        output_attention: str = "softmax",
        output_attention_kwargs: dict[str, Any] | None = None,
        output_mapping: str = "softmax",
        feature_dim: int = 512,
        embed_dim: int = 256,
        hidden_dim: int = 512,
        attention_dim: int = 512,
        dropout: float = 0.5,
        lr: float = PAPER_LR,
        betas: tuple[float, float] = PAPER_BETAS,
        lr_decay: float = 0.99,
        lr_decay_after: int = 10,
        gradient_clip_norm: float | None = 5.0,
        decoding: DecodingOptions = DecodingOptions(),  # noqa: B008 (frozen, never mutated)
    ) -> None:
        super().__init__()
        check_output_mapping(output_mapping)  # before anything is built or read
        _check_settings(image_size, lr, betas, lr_decay, lr_decay_after, gradient_clip_norm)
        self.save_hyperparameters()
        # The step's checks of attention scores and targets, read back once it has ended.
        self._step_checks = DeferredChecks()
        self.decoding = DecodingOptions.coerce(decoding)
        # A dict in the hyperparameters keeps checkpoints loadable with weights_only=True.
        self.hparams["decoding"] = asdict(self.decoding)
        encoder = build_encoder(
            encoder_arch, weights=encoder_weights, trainable=encoder_trainable, layer=encoder_layer
        )
        decoder = AttentionDecoder(
            vocab_size,
            encoder.channels,
            feature_dim=feature_dim,
            embed_dim=embed_dim,
            hidden_dim=hidden_dim,
            attention_dim=attention_dim,
            input_attention=input_attention,
            input_attention_kwargs=input_attention_kwargs,
            output_attention=output_attention,
            output_attention_kwargs=output_attention_kwargs,
            dropout=dropout,
        )
        self.model = CaptionModel(encoder, decoder)
        self.vocabulary: Vocabulary | None = None
        self._decoded: dict[int, str] = {}
        self._references: dict[int, list[str]] = {}

    @classmethod
    def hparams_from_checkpoint(cls, stored: Any, source: str | Path) -> dict[str, Any]:
        """Constructor arguments from a checkpoint's hyperparameters, checked as untrusted
        plain data (:func:`captioner.checkpointing.constructor_arguments`); earlier versions'
        ``beam_size`` / ``max_length`` become the ``decoding`` options.

        Raises:
            CheckpointError: an unknown key or a value that is not plain data.
        """
        if isinstance(stored, dict) and any(key in stored for key in _LEGACY_DECODING_KEYS):
            stored = dict(stored)
            legacy = {key: stored.pop(key) for key in _LEGACY_DECODING_KEYS if key in stored}
            decoding = stored.get("decoding")
            stored["decoding"] = {**legacy, **decoding} if isinstance(decoding, dict) else legacy
        return constructor_arguments(stored, cls.__init__, source)

    # ---------------------------------------------------------------- data and vocabulary

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if datamodule is None:
            return
        vocabulary = datamodule.vocabulary
        if len(vocabulary) != self.hparams.vocab_size:
            raise ValueError(
                f"the data's vocabulary has {len(vocabulary)} words but the model was built "
                f"for vocab_size={self.hparams.vocab_size}"
            )
        self.vocabulary = vocabulary
        cache = datamodule.cached_features
        if cache is not None:
            hp = self.hparams
            settings = {"model.encoder_arch": hp.encoder_arch,
                        "model.encoder_weights": hp.encoder_weights,
                        "data.image_size": hp.image_size, "model.encoder_layer": hp.encoder_layer,
                        "model.encoder_trainable": hp.encoder_trainable}
            check_feature_cache(settings, cache)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.vocabulary is None:
            raise RuntimeError("CaptioningModule has no vocabulary to store in the checkpoint")
        checkpoint[VOCABULARY_KEY] = self.vocabulary.to_dict()
        leave_out_encoder(checkpoint, self.model.encoder)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The trainer's restore knows the file; the messages name it, as every other
        # refusal of a --ckpt_path does.
        path = self._trainer.ckpt_path if self._trainer is not None else None
        source = f"{path}: the checkpoint's" if path else "the checkpoint's"
        put_back_encoder(checkpoint, self.model.encoder, path or "checkpoint")
        stored = stored_vocabulary(checkpoint, checkpoint.get(self.CHECKPOINT_HYPER_PARAMS_KEY)
                                   or {}, path or "checkpoint")
        if self.vocabulary is not None and stored != self.vocabulary:
            raise ValueError(
                f"{source} vocabulary differs from the one built from the data "
                f"({_vocabulary_difference(stored, self.vocabulary)}); use the same Karpathy "
                "JSON and min_count as for training"
            )
        # Lightning loads the weights after this hook, and torch's error lists every name.
        problem = weights_mismatch(self.state_dict(), checkpoint.get("state_dict", {}))
        if problem is not None:
            raise ValueError(
                f"{source} weights do not fit the model built from its hyperparameters: {problem}"
            )
        if self._trainer is not None and self.trainer.state.fn == "fit":
            # Lightning restores the optimizer after this hook, from the same checkpoint; the
            # optimizer trains the parameters that require grad, in order (optimizer.adam).
            trainable = [(name, parameter) for name, parameter in self.named_parameters()
                         if parameter.requires_grad]
            problem = optimizer_state_problem(
                (checkpoint.get("optimizer_states") or [{}])[0], trainable)
            if problem is not None:
                raise ValueError(f"{source} optimizer state cannot resume this model: {problem}")
        self.vocabulary = stored

    # ---------------------------------------------------------------- model

    def decode(self, features: Tensor, options: DecodingOptions | None = None) -> list[Hypothesis]:
        """Beam-search one caption per image of ``features`` (B, h, w, C) with ``options``
        (default: the model's own :attr:`decoding`). ``<pad>`` and ``<start>`` are never
        generated, ``<unk>`` only when the options allow it."""
        options = options or self.decoding
        banned = (Vocabulary.PAD_ID, Vocabulary.START_ID)
        if not options.allow_unk:
            banned += (Vocabulary.UNK_ID,)
        return beam_search(
            self.model.decoder,
            features,
            start_id=Vocabulary.START_ID,
            end_id=Vocabulary.END_ID,
            beam_size=options.beam_size,
            max_length=options.max_length,
            length_normalization=options.length_normalization,
            block_trigrams=options.block_trigrams,
            banned_ids=banned,
            output_mapping=self.hparams.output_mapping,
        )

    def grid(self) -> tuple[int, int]:
        """(h, w) of the attention maps at the training image size."""
        size = self.hparams.image_size
        probe = torch.zeros(1, 3, size, size, device=self.device)
        encoder = self.model.encoder
        training = encoder.training
        # In eval mode: a trainable encoder in train mode would fold the probe into its
        # batch-norm statistics.
        encoder.eval()
        try:
            with torch.no_grad():
                return tuple(encoder(probe).shape[1:3])
        finally:
            encoder.train(training)

    def on_fit_start(self) -> None:
        # Validation decodes with beam search after the first epoch's training: a beam that
        # cannot fit would fail only then, the epoch lost with no checkpoint written.
        datamodule = getattr(self.trainer, "datamodule", None)
        if (datamodule is None or "val" not in datamodule.datasets
                or not self.trainer.limit_val_batches):
            return
        images = min(datamodule.hparams.eval_batch_size, len(datamodule.datasets["val"]))
        features = torch.zeros(1, *self.grid(), self.model.decoder.feature_channels,
                               device=self.device)
        with torch.no_grad():
            encoded = self.model.decoder.encode(features)
        try:
            check_search_memory(encoded, images, self.decoding.beam_size, self.hparams.vocab_size)
        except MemoryError as exc:
            raise MemoryError(f"validation: {exc} (--data.eval_batch_size and "
                              "--model.decoding.beam_size)") from None

    def words(self, token_ids) -> list[str]:
        """The words of a decoded hypothesis, one per id (so they align with its attention)."""
        if self.vocabulary is None:
            raise RuntimeError("CaptioningModule has no vocabulary (from data or a checkpoint)")
        return [self.vocabulary.itos[int(index)] for index in token_ids]

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        captions = batch["captions"]
        with self._step_checks:
            loss = teacher_forced_loss(self.model, batch["inputs"], captions,
                                       output_mapping=self.hparams.output_mapping,
                                       pad_id=Vocabulary.PAD_ID)
        self.log("train/loss", loss, prog_bar=True, batch_size=captions.shape[0])
        return loss

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        # After the optimizer step, so that reading the checks back stalls no queued work.
        self._step_checks.raise_first()

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        # The model's own setting applies unless the Trainer was given one explicitly.
        if gradient_clip_val is None and self.hparams.gradient_clip_norm is not None:
            gradient_clip_val, gradient_clip_algorithm = self.hparams.gradient_clip_norm, "norm"
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        optimizer = adam(self.parameters(), lr=self.hparams.lr, betas=self.hparams.betas)
        decay, after = self.hparams.lr_decay, self.hparams.lr_decay_after
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda epoch: lr_decay_factor(epoch, decay=decay, decay_after=after)
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"},
        }

    # ---------------------------------------------------------------- validation and test

    def _decode_batch(self, batch: dict) -> None:
        hypotheses = self.decode(self.model.features(batch["inputs"]))
        for image_id, hypothesis, references in zip(
            batch["image_ids"].tolist(), hypotheses, batch["references"], strict=True
        ):
            self._decoded[image_id] = " ".join(self.words(hypothesis.token_ids))
            self._references[image_id] = references

    def _score_decoded(self, prefix: str) -> None:
        decoded, references = self._gather(self._decoded), self._gather(self._references)
        self._decoded, self._references = {}, {}
        if not decoded:
            return
        scores = corpus_scores(decoded, references)
        for name, value in scores.items():
            # Every process scored the same gathered captions: the max over processes is the
            # value itself, exactly (a mean of equal floats need not be), and Lightning no
            # longer warns that an unsynchronized epoch metric may differ between them.
            self.log(f"{prefix}/{name}", value, prog_bar=name in ("Bleu_4", "CIDEr"),
                     sync_dist=True, reduce_fx="max")

    @staticmethod
    def _gather(per_image: dict) -> dict:
        """Union of every process's per-image dict (DDP shards the evaluation images)."""
        if not (dist.is_available() and dist.is_initialized()):
            return per_image
        shards: list[dict | None] = [None] * dist.get_world_size()
        dist.all_gather_object(shards, per_image)
        return {key: value for shard in shards for key, value in shard.items()}

    def on_validation_epoch_start(self) -> None:
        self._decoded, self._references = {}, {}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._decode_batch(batch)

    def on_validation_epoch_end(self) -> None:
        self._score_decoded("val")

    def on_test_epoch_start(self) -> None:
        self._decoded, self._references = {}, {}

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._decode_batch(batch)

    def on_test_epoch_end(self) -> None:
        self._score_decoded("test")


# The encoder settings a feature cache records, and the option that sets each.
CACHE_SETTINGS = {"arch": "model.encoder_arch", "weights": "model.encoder_weights",
                  "image_size": "data.image_size", "layer": "model.encoder_layer"}


def check_feature_cache(settings: Mapping[str, Any], cache: FeatureCache, *,
                        checkpoint: str | None = None, advice: bool = True) -> None:
    """Refuse a feature cache written by another encoder than the one configured: cached
    features are only valid for the frozen encoder that produced them. A weights file counts
    as the cache's when it is the same path or holds the same bytes (a copy, or the cache and
    its ``NAME.encoder.pt`` moved together).

    Args:
        settings: the configured values by option name: CACHE_SETTINGS' options and
            ``model.encoder_trainable``.
        cache: the feature cache, with the encoder settings it recorded.
        checkpoint: the checkpoint whose model the settings are (``--ckpt_path``), which
            keeps them: the advice is then another cache, not another setting.
        advice: end the message with what a fit should change (False: the mismatch alone,
            for a caller that does not train).

    Raises:
        ValueError: naming the option to set and the value the cache needs.
    """
    path = cache.path
    # A setting that is wrong in itself is named as such, not as a mismatch with the cache.
    check_integers([("data.image_size", settings["data.image_size"], 1)])
    if settings["model.encoder_trainable"]:
        raise ValueError(
            f"data.feature_cache={path} holds features of a frozen encoder, but "
            "model.encoder_trainable is true; drop the cache to fine-tune the encoder"
        )
    # Caches written before the layer was configurable hold layer4 features.
    cached = {"layer": "layer4", **cache.encoder}
    # Every differing setting at once: a cache of another encoder usually differs in several
    # (arch, layer, image size, weights), and one refusal per command would take as many runs.
    differing = [
        (key, option) for key, option in CACHE_SETTINGS.items()
        if not _same_setting(cached.get(key), settings[option],
                             cache.weights_sha256 if key == "weights" else None)
    ]
    if not differing:
        return
    written = ", ".join(f"{key}={cached.get(key)!r}" for key, _ in differing)
    configured = ", ".join(f"{key}={settings[option]!r}" for key, option in differing)
    mismatch = (f"feature cache {path} was written with encoder {written}, but the model has "
                f"{configured}")
    if not advice:
        raise ValueError(mismatch)
    if checkpoint is None:
        told = "to use this cache, set " + ", ".join(
            f"{option} to {_value_to_set(key, cached.get(key), cache)}"
            for key, option in differing)
    else:
        kept = ", ".join(f"{option}={settings[option]}" for _, option in differing)
        told = (f"the model of {checkpoint} keeps {kept}: give a feature cache written with "
                "that encoder, or --data.feature_cache null to read the images")
    raise ValueError(f"{mismatch}; {told}")


def _value_to_set(key: str, cached: Any, cache: FeatureCache) -> Any:
    """The value that the cache's setting ``key`` (recorded as ``cached``) asks for: the
    recorded one, but for weights no longer at the recorded path, the file beside the cache
    that holds them (the cache and its ``NAME.encoder.pt`` moved together), if any."""
    if key != "weights" or not isinstance(cached, str) or Path(cached).exists():
        return cached
    from captioner.features.random_encoder import encoder_weights_path

    beside = encoder_weights_path(cache.path)
    if beside.is_file() and file_sha256(beside) == cache.weights_sha256:
        return str(beside)
    return f"{cached} (no longer there: a copy of it)"


def _same_setting(cached: Any, configured: Any, sha256: str | None = None) -> bool:
    """Equal values, or one weights file: two spellings of its path (relative vs absolute), or
    a configured file holding the bytes whose SHA-256 the cache recorded (``sha256``)."""
    if cached == configured:
        return True
    if not (isinstance(cached, str) and isinstance(configured, str)):
        return False
    if Path(cached).exists() and Path(cached).resolve() == Path(configured).resolve():
        return True
    return sha256 is not None and Path(configured).is_file() and file_sha256(configured) == sha256


def corpus_scores(decoded: dict[int, str], references: dict[int, list[str]]) -> dict[str, float]:
    """BLEU-4 and CIDEr-D of whitespace-tokenized captions, by pycocoevalcap's scorers (CIDEr
    through :func:`captioner.cider.cider_d`: NaN for a single image).

    ``decoded`` maps image id -> hypothesis, ``references`` image id -> reference strings; both
    are already tokenized and lower-cased (Karpathy tokens, vocabulary words), so the PTB
    tokenizer (a Java process) is not needed during training.
    """
    ids = sorted(decoded)
    hypotheses = {i: [decoded[i]] for i in ids}
    refs = {i: list(references[i]) for i in ids}
    bleu, _ = Bleu(4).compute_score(refs, hypotheses, verbose=0)
    cider, _ = cider_d(refs, hypotheses)
    return {"Bleu_4": float(bleu[3]), "CIDEr": float(cider)}


def stored_vocabulary(checkpoint: Mapping[str, Any], hparams: Mapping[str, Any],
                      path: Path | str) -> Vocabulary:
    """The vocabulary that ``checkpoint`` (read from ``path``) stores, which must have the
    ``vocab_size`` of its hyperparameters ``hparams``.

    Raises:
        CheckpointError: none stored, not a vocabulary, or of another size (one line).
    """
    if VOCABULARY_KEY not in checkpoint:
        raise CheckpointError(f"{path}: no {VOCABULARY_KEY!r} entry; not a checkpoint written "
                              "by captioner training")
    try:
        vocabulary = Vocabulary.from_dict(checkpoint[VOCABULARY_KEY])
    except ValueError as exc:
        raise CheckpointError(f"{path}: its {exc}") from None
    if len(vocabulary) != hparams.get("vocab_size"):
        raise CheckpointError(f"{path}: vocabulary has {len(vocabulary)} words but vocab_size "
                              f"is {hparams.get('vocab_size')}")
    return vocabulary


def _vocabulary_difference(stored: Vocabulary, built: Vocabulary) -> str:
    """How two vocabularies differ, in a few words: sizes, or the first word that differs."""
    if len(stored) != len(built):
        return f"{len(stored)} vs {len(built)} words"
    index = next(i for i, (a, b) in enumerate(zip(stored.itos, built.itos, strict=True)) if a != b)
    return (f"both {len(stored)} words, but word {index} is {stored.itos[index]!r} in the "
            f"checkpoint and {built.itos[index]!r} from the data")
