"""``captioner fit|validate|test``: LightningCLI over CaptioningModule and CaptionDataModule.

    captioner fit --config configs/coco_tvmax.yaml
    captioner fit --config configs/coco_tvmax.yaml --ckpt_path last       # resume
    captioner test --config configs/coco_tvmax.yaml --ckpt_path best.ckpt
    captioner fit --config configs/coco_tvmax.yaml --print_config

The vocabulary size is linked from the data to the model (it is known only once the Karpathy
JSON is read) and the image size from the data to the model (inference resizes the same way).
The best checkpoint is chosen on ``val/CIDEr`` (the ``checkpoint.*`` options) and checkpoints
are written atomically. Several GPUs or nodes: ``--trainer.strategy ddp --trainer.devices N
--trainer.num_nodes M`` (Lightning's DDP; validation captions are gathered from every process
before scoring).
"""

from __future__ import annotations

HELP = "train / validate / test a captioner with Lightning from YAML configs (configs/*.yaml)"
NEEDS_COMMAND_NAME = True

CHECKPOINT_DEFAULTS = {
    "checkpoint.monitor": "val/CIDEr",
    "checkpoint.mode": "max",
    "checkpoint.save_last": True,
    "checkpoint.filename": "best-epoch{epoch:02d}-cider{val/CIDEr:.4f}",
    "checkpoint.auto_insert_metric_name": False,
}
TRAINER_DEFAULTS = {
    "plugins": {"class_path": "captioner.checkpointing.AtomicCheckpointIO"},
    "logger": {
        "class_path": "lightning.pytorch.loggers.CSVLogger",
        "init_args": {"save_dir": "runs"},
    },
}


def build_cli(args: list[str] | None, *, run: bool = True):
    """The LightningCLI for ``args`` (sub-command first when ``run``; None: sys.argv)."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.cli import LightningCLI

    from captioner.data import CaptionDataModule
    from captioner.lightning_module import CaptioningModule

    class CaptionerCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
            parser.set_defaults(CHECKPOINT_DEFAULTS)
            parser.link_arguments("data.image_size", "model.image_size")
            parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")

    return CaptionerCLI(
        CaptioningModule,
        CaptionDataModule,
        args=args,
        run=run,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"prog": "captioner"},
    )


def main(argv: list[str]) -> int:
    import sys

    # LightningCLI warns when it is handed args while sys.argv also holds some; from the console
    # script they are the same words, so let it read sys.argv itself.
    args = None if list(argv) == sys.argv[1:] else list(argv)
    build_cli(args)
    return 0
