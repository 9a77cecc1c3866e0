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

from dataclasses import asdict
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from pycocoevalcap.bleu.bleu import Bleu
from torch import Tensor

from captioner.attention import DeferredChecks
from captioner.checkpointing import (
    VOCABULARY_KEY,
    optimizer_state_problem,
    stored_vocabulary,
    weights_mismatch,
)
from captioner.cider import cider_d
from captioner.features.cache_check import check_feature_cache, model_settings
from captioner.model.caption_model import attention_grid, build_caption_model
from captioner.model.decoding import Hypothesis, check_search_memory, decode_captions
from captioner.model.decoding_options import DecodingOptions
from captioner.model.frozen_encoder import leave_out_encoder, put_back_encoder
from captioner.model.hyperparameters import DEFAULTS, check_settings, model_arguments
from captioner.model.losses import check_output_mapping, teacher_forced_loss
from captioner.training.optimizer import adam
from data_prep.vocab import Vocabulary

# The metrics a fit logs, which its best checkpoint can be chosen by (--checkpoint.monitor):
# the training loss every step, and corpus_scores' BLEU-4 and CIDEr-D of every validation.
LOGGED_METRICS = ("train/loss", "val/Bleu_4", "val/CIDEr")


def lr_decay_factor(epoch: int, *, decay: float, decay_after: int) -> float:
    """Learning-rate factor of 0-based ``epoch``: 1 for the first ``decay_after`` epochs, then
    ``decay`` per further epoch (paper: after the 10th epoch, x0.99 per epoch)."""
    return decay ** max(0, epoch - decay_after + 1)


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
        encoder_arch: str = DEFAULTS["encoder_arch"],
        encoder_weights: str | None = DEFAULTS["encoder_weights"],
        encoder_trainable: bool = DEFAULTS["encoder_trainable"],
        encoder_layer: str = DEFAULTS["encoder_layer"],
        image_size: int = DEFAULTS["image_size"],
        input_attention: str = DEFAULTS["input_attention"],
        input_attention_kwargs: dict[str, Any] | None = DEFAULTS["input_attention_kwargs"],
        output_attention: str = DEFAULTS["output_attention"],
        output_attention_kwargs: dict[str, Any] | None = DEFAULTS["output_attention_kwargs"],
        output_mapping: str = DEFAULTS["output_mapping"],
        feature_dim: int = DEFAULTS["feature_dim"],
        embed_dim: int = DEFAULTS["embed_dim"],
        hidden_dim: int = DEFAULTS["hidden_dim"],
        attention_dim: int = DEFAULTS["attention_dim"],
        dropout: float = DEFAULTS["dropout"],
        lr: float = DEFAULTS["lr"],
        betas: tuple[float, float] = DEFAULTS["betas"],
        lr_decay: float = DEFAULTS["lr_decay"],
        lr_decay_after: int = DEFAULTS["lr_decay_after"],
        gradient_clip_norm: float | None = DEFAULTS["gradient_clip_norm"],
        decoding: DecodingOptions = DEFAULTS["decoding"],
    ) -> None:
        super().__init__()
        check_output_mapping(output_mapping)  # before anything is built or read
        check_settings(image_size, lr, betas, lr_decay, lr_decay_after, gradient_clip_norm)
        self.save_hyperparameters()
        # The step's checks of attention scores and targets, read back once it has ended.
        self._step_checks = DeferredChecks()
        self.decoding = DecodingOptions.coerce(decoding)
        # A dict in the hyperparameters keeps checkpoints loadable with weights_only=True.
        self.hparams["decoding"] = asdict(self.decoding)
        self.model = build_caption_model(**model_arguments(self.hparams))
        self.vocabulary: Vocabulary | None = None
        self._decoded: dict[int, str] = {}
        self._references: dict[int, list[str]] = {}

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
            check_feature_cache(model_settings(self.hparams), cache)

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
        return decode_captions(self.model.decoder, features, options or self.decoding,
                               self.hparams.output_mapping)

    def grid(self) -> tuple[int, int]:
        """(h, w) of the attention maps at the training image size."""
        return attention_grid(self.model.encoder, self.hparams.image_size, self.device)

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


def _vocabulary_difference(stored: Vocabulary, built: Vocabulary) -> str:
    """How two vocabularies differ, in a few words: sizes, or the first word that differs."""
    if len(stored) != len(built):
        return f"{len(stored)} vs {len(built)} words"
    index = next(i for i, (a, b) in enumerate(zip(stored.itos, built.itos, strict=True)) if a != b)
    return (f"both {len(stored)} words, but word {index} is {stored.itos[index]!r} in the "
            f"checkpoint and {built.itos[index]!r} from the data")
