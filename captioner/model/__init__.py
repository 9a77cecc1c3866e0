"""Captioning model: ResNet grid encoder and LSTM decoder with input/output visual attention,
decoding, losses, checkpoint weights. Import from the submodules: this package imports nothing,
so that light modules such as decoding_options load without torch."""
