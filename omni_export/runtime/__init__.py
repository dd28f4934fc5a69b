"""The runtime every recipe shares: runners (ONNX Runtime, the HTP simulator, ExecuTorch), the
spawned-worker plumbing, graph sessions by name (fp32 eager or a build's artifacts), and what every
synth command needs. Knows no recipe; recipes, parity and the exporters build on it."""
