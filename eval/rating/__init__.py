"""The blinded human rating study (paper appendix B): the kit raters open in a browser
(:mod:`.kit`, written by :mod:`.kit_folder`), the stop words left out of its attention plots
(:mod:`.stopwords`), and the unblinded summary of the ratings (:mod:`.summary`)."""
