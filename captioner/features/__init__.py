"""Feature preparation: the grid features of a frozen ResNet cached once per dataset
(:mod:`~captioner.features.extraction`, behind ``captioner prepare-features``), and the
pretraining of a small encoder on cell labels (:mod:`~captioner.features.pretraining`, behind
``captioner pretrain-encoder``), with the commands that ``prepare-dataset`` and
``prepare-features`` print to run next (:mod:`~captioner.features.next_steps`). The cache
format itself is :mod:`data_prep.features`."""
