"""Feature preparation: the grid features of a frozen ResNet cached once per dataset
(:mod:`~captioner.features.extraction`, behind ``captioner prepare-features``), and the
pretraining of a small encoder on cell labels (:mod:`~captioner.features.pretraining`, behind
``captioner pretrain-encoder``). The cache format itself is :mod:`data_prep.features`."""
