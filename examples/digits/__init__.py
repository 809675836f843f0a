"""The digits example: a small CNN on scikit-learn's offline 8x8 digits, trained in pure numpy.

The committed files beside this module (model.onnx, calib.npz, eval.npz) are what the tutorials
and the accuracy tests compile and measure; `ember examples build --only digits` regenerates them.
"""
