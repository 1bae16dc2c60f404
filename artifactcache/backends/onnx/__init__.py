"""ort: an ONNX export run by ONNX Runtime; the export is what TensorRT reads too."""
