"""ONNX conformance of fusegraph: the harness, the exclusion list and the per-op summary."""
