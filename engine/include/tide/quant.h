/* tide/quant.h - quantised weight formats, dequantisation and grouped linear kernels.
 * Part of tide.h; include tide.h, not this file. */
