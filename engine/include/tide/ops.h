/* tide/ops.h - model-level ops: RMSNorm, embedding, mHC, MoE routing and experts.
 * Part of tide.h; include tide.h, not this file. */
