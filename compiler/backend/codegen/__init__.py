"""Code generation: tiled layers → DRAM image and steps of instructions (`generate`)."""
