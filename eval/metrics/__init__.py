"""Caption metrics: the coco-caption scorers behind pycocoevalcap (:mod:`.coco`, with the PTB
tokenizer, METEOR and SPICE on the JVM: :mod:`.ptb`, :mod:`.spice`, :mod:`.spice_jars`,
:mod:`.java_tools`), REP (:mod:`.rep`), object mentions and attention precision
(:mod:`.objects`), and all of them in one call (:mod:`.scoring`)."""
