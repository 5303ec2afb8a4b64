"""Pure tensor helpers below the losses (torch only): token choice (`sampling`), decoder-input corruption
(`decoder_inputs`), the scoring pass's reductions a slice of the vocabulary at a time (`lm_head`) over a model's
output layer and positions (`output_layer`), vocabulary kernels over logits (`logprobs`: token log-probs, entropy,
KL), divergences between two distributions (`divergences`), baselines and advantages (`advantages`), minimum risk
training's math over a candidate set (`risk`) and professor forcing's losses (`adversarial`)."""
