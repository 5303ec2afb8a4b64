"""Pure tensor helpers below the losses (torch only): token choice (`sampling`), decoder-input corruption
(`decoder_inputs`), the vocabulary kernels of the scoring pass (`logprobs`: token log-probs, entropy, KL), and
baselines and advantages (`advantages`)."""
