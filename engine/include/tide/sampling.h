/* tide/sampling.h - candidates, sampler helpers and the per-request RNG.
 * Part of tide.h; include tide.h, not this file. */
