/* tide/tokenizer.h - the Hugging Face tokenizer.json encoder/decoder.
 * Part of tide.h; include tide.h, not this file. */
