/* tide/checkpoint.h - safetensors checkpoints, config, the writer.
 * Part of tide.h; include tide.h, not this file. */
