"""The forward pass: each family's anatomy, hooks, the lean torch forward, ONNX Runtime; imports no other layer."""
