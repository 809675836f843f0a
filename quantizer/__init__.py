"""The quantizer: fp32 Graph + profile → int8 Graph, and its integer reference interpreter.

    from quantizer.quantize import QuantOptions, quantize
    from quantizer.reference import run_int8

`calibrate` (ranges from histograms, ranges → QuantParams), `quantize` (the rewrite), `cleanup`
(Rescale folding), `reference` (the integer oracle), `verify` (quantized-graph invariants).
"""
