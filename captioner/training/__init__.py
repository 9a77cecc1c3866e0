"""Training: the LightningModule (:mod:`.module`) and DataModule (:mod:`.datamodule`) of a
captioner, its hyperparameters as checkpoints store them, which inference reads without
Lightning (:mod:`.hyperparameters`), its optimizer (:mod:`.optimizer`), the LightningCLI of
``captioner fit|validate|test`` (:mod:`.cli`), the run folders and the callbacks that keep a
resume exact (:mod:`.runs`), the folders as ``captioner runs`` lists them (:mod:`.folders`)
and its table (:mod:`.run_table`), and how a run stops (:mod:`.stops`)."""
