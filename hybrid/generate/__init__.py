"""`hybrid generate`: decoding from a hybrid checkpoint or a transformers folder -- inference, beside training
(hybrid/train/) and conversion (hybrid/convert/). The decoding loop, sampling and model loading are decode.py."""
