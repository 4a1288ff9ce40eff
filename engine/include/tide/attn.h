/* tide/attn.h - paged KV caches and the DeepSeek-V4 sparse-attention kernels.
 * Part of tide.h; include tide.h, not this file. */
