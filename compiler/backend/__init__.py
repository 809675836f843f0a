"""The int8 backend: a quantized Graph → a Program for the accelerator, in this order
(`compiler.pipeline.compile_int8` runs it):

1. `lower/` (with `partition`): every integer node → one array, vector or host layer over DRAM
   tensors (`layers`); views vanish.
2. `layer_order`: an order of the layers that keeps little activation memory live.
3. `tiling`: each layer's tile sizes and local-memory regions, from the architecture.
4. `reuse`: activations that stay in the scratchpad between consecutive layers.
5. `codegen`: each layer's constants into the DRAM image and its instructions into `steps`
   (`codegen.convolution`, `codegen.vector`, `codegen.host`, built through `codegen.emit`).
6. `memory`: DRAM activation buffers by liveness.
7. `schedule`: program order and dependency tokens from the hazards.
8. `program`: options, I/O bindings and the compile summary.
"""
